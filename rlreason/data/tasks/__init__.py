"""Procedural reasoning tasks with exact verifiers and a difficulty knob.

    task = tasks.get("arithmetic")
    problem = task.generate(seed=0, difficulty=1)
    task.verify(problem.solution, problem.answer)  # -> 1.0
    train = task.problems("train", n=1000, difficulty=1, seed=0)
    task.split_of(problem.prompt)  # -> "train" or "eval"

Every task's completions end with the line `answer: <value>` (see
`tasks.base`); train and eval splits never share a prompt.
"""

from rlreason.data.tasks import arithmetic
from rlreason.data.tasks import countdown
from rlreason.data.tasks import knights
from rlreason.data.tasks import shortest_path
from rlreason.data.tasks.base import ANSWER_PREFIX
from rlreason.data.tasks.base import Problem
from rlreason.data.tasks.base import Task
from rlreason.data.tasks.base import extract_answer

_REGISTRY: dict[str, Task] = {
  t.name: t
  for t in (
    arithmetic.Arithmetic(),
    arithmetic.OrderSensitive(),
    arithmetic.Arithmetic("arithmetic5", max_operand=5),
    arithmetic.OrderSensitive("arithmetic5_order", max_operand=5),
    arithmetic.Arithmetic("addsub5", max_operand=5, ops="+-"),
    arithmetic.OrderSensitive("addsub5_order", max_operand=5, ops="+-"),
    countdown.Countdown(),
    knights.KnightsKnaves(),
    shortest_path.ShortestPath(),
  )
}

__all__ = [
  "ANSWER_PREFIX",
  "Problem",
  "Task",
  "extract_answer",
  "get",
  "names",
  "register",
]


def get(name: str) -> Task:
  """The registered task called `name`."""
  try:
    return _REGISTRY[name]
  except KeyError:
    raise KeyError(f"unknown task {name!r}; known: {names()}") from None


def names() -> list[str]:
  return sorted(_REGISTRY)


def register(task: Task) -> Task:
  """Adds a task instance to the registry (e.g. from an experiment file)."""
  if task.name in _REGISTRY:
    raise ValueError(f"task {task.name!r} is already registered")
  _REGISTRY[task.name] = task
  return task
