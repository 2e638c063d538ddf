"""Difficulty schedules: prompt batches whose difficulty changes over time.

Logic-RL (Xie et al. 2025, arXiv:2502.14768) finds that, for the same data,
a curriculum (easy puzzles first) beats a random shuffle. A schedule is a
list of stages, each a start batch and a difficulty range:

    "0:1,40:1-2,80:2-3"  ->  batches 0..39 from difficulty 1, 40..79 from
                             difficulties 1-2, 80.. from 2-3

`StagedPrompts` draws batch k from the pool of the stage it falls in, with
one `iterator.PromptIterator` per stage, so it is deterministic in (seed, k)
and resumable from its `state()`, like `PromptIterator`; pass it to the
loop with `loop.train(..., prompt_iterator=curriculum.make(schedule))`.
Batches are counted as drawn (a method that samples extra batches per step,
e.g. dynamic sampling, advances the schedule faster than the step count).
"""

from typing import Callable, Sequence

from rlreason.data import iterator
from rlreason.data import sources as data_lib


def parse_schedule(text: str) -> list[tuple[int, tuple[int, int]]]:
  """'0:1,40:1-2' -> [(0, (1, 1)), (40, (1, 2))], sorted, starting at 0.

  Raises:
    ValueError: a malformed item, a repeated start, or no stage at 0.
  """
  stages = []
  for item in filter(None, (s.strip() for s in text.split(","))):
    start, sep, levels = item.partition(":")
    lo, _, hi = levels.partition("-")
    try:
      if not sep:
        raise ValueError
      stage = (int(start), (int(lo), int(hi or lo)))
    except ValueError:
      raise ValueError(
        f"bad curriculum stage {item!r}; expected START:LEVEL or "
        "START:LO-HI, e.g. '0:1,40:1-2'"
      ) from None
    if stage[0] < 0 or stage[1][0] > stage[1][1]:
      raise ValueError(f"bad curriculum stage {item!r}")
    stages.append(stage)
  stages.sort()
  starts = [s for s, _ in stages]
  if not stages or starts[0] != 0 or len(set(starts)) != len(starts):
    raise ValueError(
      f"curriculum {text!r} must have one stage starting at batch 0 and "
      "distinct starts"
    )
  return stages


class StagedPrompts:
  """Prompt batches following a difficulty schedule (see module doc).

  Args:
    examples: all training examples; `Example.difficulty` selects a stage's
      pool.
    batch_size: prompts per batch.
    schedule: `parse_schedule` output.
    seed: seed of the stage iterators (stage k shuffles with seed + k).
  """

  def __init__(
    self,
    examples: Sequence[data_lib.Example],
    batch_size: int,
    schedule: list[tuple[int, tuple[int, int]]],
    *,
    seed: int = 0,
  ):
    self.schedule = schedule
    self.stages = []
    for k, (start, (lo, hi)) in enumerate(schedule):
      pool = [e for e in examples if lo <= e.difficulty <= hi]
      if not pool:
        raise ValueError(
          f"curriculum stage {k} (from batch {start}) asks for difficulty "
          f"{lo}-{hi}; the data has none (difficulties: "
          f"{sorted({e.difficulty for e in examples})})"
        )
      self.stages.append(
        iterator.PromptIterator(pool, batch_size, seed=seed + k)
      )
    self.drawn = 0

  def stage(self, batch: int) -> int:
    """Index of the stage batch number `batch` (0-based) is drawn from."""
    return max(k for k, (s, _) in enumerate(self.schedule) if s <= batch)

  def __iter__(self):
    return self

  def __next__(self) -> list[data_lib.Example]:
    batch = next(self.stages[self.stage(self.drawn)])
    self.drawn += 1
    return batch

  def state(self) -> dict:
    return {
      "drawn": self.drawn,
      "stages": [s.state() for s in self.stages],
    }

  def restore(self, state: dict) -> None:
    if len(state["stages"]) != len(self.stages):
      raise ValueError(
        f"checkpoint has {len(state['stages'])} curriculum stages, the "
        f"schedule {len(self.stages)}"
      )
    self.drawn = int(state["drawn"])
    for it, s in zip(self.stages, state["stages"], strict=True):
      it.restore(s)


def make(schedule: str) -> Callable:
  """A `loop.train(prompt_iterator=...)` factory for a schedule string."""
  stages = parse_schedule(schedule)

  def factory(cfg, examples):
    return StagedPrompts(examples, cfg.batch_size, stages, seed=cfg.seed)

  return factory
