"""Format rewards: R1 think/answer tags and the procedural answer line.

The format checks return float32 [N] in {0, 1}; `logic_rl` and
`format_gated` combine a format check with correctness. Scans use
str.find/count (linear time), so hostile completions cannot trigger regex
backtracking.
"""

from typing import Sequence

import numpy as np

from rlreason.data import extract
from rlreason.data.tasks import base as tasks_base

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


def format_tags(
  completions: Sequence[str], answers=None, *, prefilled: str = ""
) -> np.ndarray:
  """1 iff the text starts with `<think>` and each of the four tags occurs
  exactly once, in order; anything may sit between `</think>` and
  `<answer>` or follow `</answer>` (RLPR's R1 format score, its
  format_reward: the tags once each and a full match of
  <think>.*</think>.*<answer>.*</answer>.*). `prefilled` as format_strict.
  """
  out = []
  for c in completions:
    text = prefilled + c
    ok = text.startswith("<think>") and all(text.count(t) == 1 for t in _TAGS)
    where = [text.find(t) for t in _TAGS]
    out.append(ok and where == sorted(where))
  return np.array(out, np.float32)


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


def logic_rl(
  completions: Sequence[str],
  answers: Sequence[str],
  *,
  check,
  prefilled: str = "",
  format_ok: float = 1.0,
  format_bad: float = -1.0,
  right: float = 2.0,
  wrong: float = -1.5,
  missing: float = -2.0,
) -> np.ndarray:
  """Logic-RL's rule reward (Xie et al. 2025, arXiv:2502.14768, Sec. 2).

      S = S_format + S_answer
      S_format = +1 if `format_strict` holds, else -1
      S_answer = +2 if the answer tag's value is correct, -1.5 if it is
                 wrong, -2 if there is no (non-empty) answer tag or the
                 format fails (the answer is checked only "once the format
                 is validated", Sec. 2.2; the authors' kk.py)

  The strict format penalises the shortcuts the paper saw (skipping the
  think block, answering outside the tags, several answer blocks).

  Args:
    completions: N completions.
    answers: N gold answers.
    check: fn(value, gold) -> bool, the task's answer check.
    prefilled: text the prompt ends with (e.g. "<think>" for the R1
      template), prepended for the format check.
  """
  if answers is None or len(answers) != len(completions):
    raise ValueError("need one gold answer per completion")
  fmt = format_strict(completions, prefilled=prefilled) > 0
  out = np.where(fmt, format_ok, format_bad).astype(np.float32)
  for i, (c, gold) in enumerate(zip(completions, answers, strict=True)):
    value = extract.answer_tag(c)
    if not fmt[i] or not value:
      out[i] += missing
      continue
    try:
      ok = bool(check(value, gold))
    except (ValueError, ArithmeticError, RecursionError):
      ok = False
    out[i] += right if ok else wrong
  return out


def format_gated(correct, format_ok, *, penalty: float = -1.0) -> np.ndarray:
  """Correctness where the format holds, `penalty` where it does not.

  The format-gated rule reward that SimpleRL-Zoo (Zeng et al. 2025,
  arXiv:2503.18892) weighs against correctness alone: r = correct in
  {0, 1} for well-formatted responses, `penalty` otherwise. [N] arrays in,
  float32 [N] out.
  """
  correct = np.asarray(correct, np.float32)
  format_ok = np.asarray(format_ok, np.float32) > 0
  return np.where(format_ok, correct, penalty).astype(np.float32)
