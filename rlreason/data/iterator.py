"""Deterministic, resumable batches of prompts for the training loop.

  prompts = iterator.PromptIterator(sources.load(spec), batch_size, seed=0)
  batch = next(prompts)  # this process's slice of the next global batch
  state = prompts.state()  # {"epoch": e, "index": i}, saved with checkpoints

The examples come from sources.load (or any sequence of sources.Example).
"""

from typing import Sequence

import numpy as np

from rlreason.data.sources import Example


class PromptIterator:
  """Deterministic batches of examples, resumable from two ints.

  The examples are visited epoch after epoch, each epoch in the order of a
  permutation drawn from (seed, epoch); a batch may straddle two epochs, so
  nothing is dropped. The position is `state() == {"epoch": e, "index": i}`
  (i-th item of epoch e's order): saving it with the checkpoint and passing it
  to `restore` continues exactly. Every process computes the same global
  batch of `batch_size` and keeps its own contiguous slice
  (`process_index` of `process_count`), so hosts stay in step.
  """

  def __init__(
    self,
    examples: Sequence[Example],
    batch_size: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    process_index: int = 0,
    process_count: int = 1,
  ):
    if not examples:
      raise ValueError("no examples")
    if batch_size % process_count:
      raise ValueError(
        f"batch_size={batch_size} not divisible by {process_count} processes"
      )
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} of {process_count}")
    self.examples = list(examples)
    self.batch_size = batch_size
    self.seed = seed
    self.shuffle = shuffle
    self.process_index = process_index
    self.process_count = process_count
    self.epoch, self.index = 0, 0
    self._order_epoch, self._order = None, None

  def order(self, epoch: int) -> np.ndarray:
    """The visiting order of one epoch: int [len(examples)]."""
    if self._order_epoch != epoch:
      n = len(self.examples)
      if self.shuffle:
        rng = np.random.default_rng([self.seed, epoch])
        self._order = rng.permutation(n)
      else:
        self._order = np.arange(n)
      self._order_epoch = epoch
    return self._order

  def global_batch(self) -> list[Example]:
    """The next global batch (all processes), advancing the position."""
    batch = []
    while len(batch) < self.batch_size:
      order = self.order(self.epoch)
      take = min(self.batch_size - len(batch), len(order) - self.index)
      batch += [self.examples[j] for j in order[self.index : self.index + take]]
      self.index += take
      if self.index == len(order):
        self.epoch, self.index = self.epoch + 1, 0
    return batch

  def __iter__(self):
    return self

  def __next__(self) -> list[Example]:
    """This process's slice of the next global batch."""
    local = self.batch_size // self.process_count
    start = self.process_index * local
    return self.global_batch()[start : start + local]

  def state(self) -> dict[str, int]:
    return {"epoch": int(self.epoch), "index": int(self.index)}

  def restore(self, state: dict[str, int]) -> None:
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index < len(self.examples):
      raise ValueError(f"bad iterator state {state}")
    self.epoch, self.index = epoch, index

  def seek(self, step: int) -> None:
    """Positions the iterator before batch number `step` (0-based)."""
    self.epoch, self.index = divmod(step * self.batch_size, len(self.examples))
