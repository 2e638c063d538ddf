"""Format rewards: R1 think/answer tags and the procedural answer line.

All return float32 [N] in {0, 1}. Scans use str.find/count (linear time), so
hostile completions cannot trigger regex backtracking.
"""

from typing import Sequence

import numpy as np

from rlreason.tasks import base as tasks_base

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _strict_ok(text: str) -> bool:
  text = text.strip()
  if any(text.count(tag) != 1 for tag in _TAGS):
    return False
  if not (text.startswith("<think>") and text.endswith("</answer>")):
    return False
  think_end = text.find("</think>")
  answer_start = text.find("<answer>")
  if answer_start < think_end:
    return False
  answer = text[answer_start + len("<answer>") : -len("</answer>")]
  return not text[think_end + len("</think>") : answer_start].strip() and bool(
    answer.strip()
  )


def format_strict(
  completions: Sequence[str], answers=None, *, prefilled: str = ""
) -> np.ndarray:
  """1 iff the completion is exactly `<think>...</think> <answer>...</answer>`.

  Logic-RL / DeepSeek-R1 strict format: each of the four tags exactly once,
  in order, nothing before `<think>` or after `</answer>` except whitespace,
  only whitespace between `</think>` and `<answer>`, a non-empty answer.

  Args:
    completions: N completions.
    answers: ignored (registry signature).
    prefilled: text the prompt already ends with, e.g. "<think>\n" for chat
      templates that open the think block; it is prepended before checking.
  """
  return np.array([_strict_ok(prefilled + c) for c in completions], np.float32)


def format_soft(
  completions: Sequence[str], answers=None, *, prefilled: str = ""
) -> np.ndarray:
  """1 iff `<think>`, `</think>`, `<answer>`, `</answer>` occur in order."""
  out = []
  for c in completions:
    text, pos, ok = prefilled + c, 0, True
    for tag in _TAGS:
      pos = text.find(tag, pos)
      if pos < 0:
        ok = False
        break
      pos += len(tag)
    out.append(ok)
  return np.array(out, np.float32)


def answer_line(completions: Sequence[str], answers=None) -> np.ndarray:
  """1 iff the completion ends with a valid `answer: <value>` line (tasks)."""
  return np.array(
    [tasks_base.extract_answer(c) is not None for c in completions],
    np.float32,
  )
