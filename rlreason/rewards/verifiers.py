"""Exact-match and procedural-task verifiers as batch rewards."""

from typing import Sequence

import numpy as np

from rlreason.data import tasks
from rlreason.data import extract


def _check_lengths(completions, answers):
  if answers is None or len(completions) != len(answers):
    raise ValueError("need one gold answer per completion")


def exact_match(
  completions: Sequence[str], answers: Sequence[str]
) -> np.ndarray:
  """1 iff the extracted final answer equals the gold one as text.

  Extraction as in `extract.extract` (answer tag, boxed, Answer line); both
  sides go through `extract.normalize` (spaces, `$`, `\\text{}`, ...).
  """
  _check_lengths(completions, answers)
  out = np.zeros(len(completions), np.float32)
  for i, (c, gold) in enumerate(zip(completions, answers, strict=True)):
    pred = extract.extract(c)
    out[i] = float(
      pred is not None and extract.normalize(pred) == extract.normalize(gold)
    )
  return out


def make_task_reward(name: str):
  """The batch reward of procedural task `name` (its exact verifier).

  Task verifiers are our own bounded parsers, so they run inline, not in the
  process pool.
  """
  task = tasks.get(name)

  def task_reward(
    completions: Sequence[str], answers: Sequence[str]
  ) -> np.ndarray:
    _check_lengths(completions, answers)
    return np.array(
      [task.verify(c, a) for c, a in zip(completions, answers, strict=True)],
      np.float32,
    )

  task_reward.__name__ = f"task_{name}"
  task_reward.__doc__ = f"Exact verifier of the procedural task {name!r}."
  return task_reward
