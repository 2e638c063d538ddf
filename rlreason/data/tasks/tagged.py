"""Think/answer-tagged variants of the procedural tasks (R1 format).

`<name>_tags` is task `<name>` whose reference solutions are written in the
DeepSeek-R1 / Logic-RL format

    <think>
    KK x J
    NK ok
    </think>
    <answer>J=N,Z=K</answer>

(the task's step-by-step trace inside the think block, its answer value
inside the answer tags), so a warm start on them teaches the format that
format rewards check. The verifier reads the last `<answer>...</answer>`
and applies the task's own check; prompts, answers, uids, splits and
difficulties are the task's. `register_all()` (called by the experiments
that use them) adds a variant of every task to the registry:

    data spec  task:knights_tags:difficulty=1-2
    reward     task:knights_tags

They are not registered by default: the variants' solutions do not end
with the answer line that `tasks.base` promises for registered tasks.
"""

import random

from rlreason.data import tasks
from rlreason.data import extract
from rlreason.data.tasks import base

SUFFIX = "_tags"


def tagged_solution(solution: str) -> str:
  """A task solution (trace + final answer line) in think/answer tags."""
  trace, _, last = solution.rstrip().rpartition("\n")
  value = base.extract_answer(last)
  if value is None:
    raise ValueError(f"solution does not end with an answer line: {last!r}")
  return f"<think>\n{trace}\n</think>\n<answer>{value}</answer>"


def answer_value(completion: str) -> str | None:
  """The stripped content of the last `<answer>` tag, or None."""
  value = extract.answer_tag(completion)
  return value or None


class Tagged(base.Task):
  """Task `inner` with R1-tagged solutions and a tag-reading verifier."""

  def __init__(self, inner: base.Task):
    self.inner = inner
    self.name = inner.name + SUFFIX
    self.max_difficulty = inner.max_difficulty

  def _generate(self, rng: random.Random, difficulty: int):
    prompt, answer, solution, knowledge = self.inner._generate(rng, difficulty)
    return prompt, answer, tagged_solution(solution), knowledge

  def generate(self, seed: int, difficulty: int) -> base.Problem:
    # The inner task's problem for the same (seed, difficulty): the variant
    # shares prompts, answers and uids with its task.
    p = self.inner.generate(seed, difficulty)
    return base.Problem(
      p.prompt,
      p.answer,
      tagged_solution(p.solution),
      p.difficulty,
      p.knowledge,
      p.uid,
    )

  def check(self, value: str, answer: str) -> bool:
    return self.inner.check(value, answer)

  def split_key(self, prompt: str) -> str:
    return self.inner.split_key(prompt)

  def verify(self, completion: str, answer: str) -> float:
    """1.0 iff the last answer tag holds a correct value, else 0.0."""
    value = answer_value(completion)
    if value is None:
      return 0.0
    try:
      return 1.0 if self.check(value, answer) else 0.0
    except (ValueError, ArithmeticError, RecursionError):
      return 0.0


def register_all() -> None:
  """Registers `<name>_tags` for every task that has no variant yet."""
  for name in tasks.names():
    if name.endswith(SUFFIX) or name + SUFFIX in tasks.names():
      continue
    tasks.register(Tagged(tasks.get(name)))
