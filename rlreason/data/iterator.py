"""Deterministic, resumable batches of prompts for the training loop.

  prompts = iterator.PromptIterator(sources.load(spec), batch_size, seed=0)
  batch = next(prompts)  # this process's slice of the next global batch
  state = prompts.state()  # {"epoch": e, "index": i}, saved with checkpoints

The examples come from sources.load (or any sequence of sources.Example).
PutBack puts a queue of examples to sample again in front of one.
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


def default(cfg, examples: Sequence[Example]) -> PromptIterator:
  """The training loop's prompt iterator when no prompt_iterator hook is
  given: cfg.batch_size a batch, shuffled by cfg.seed."""
  return PromptIterator(examples, cfg.batch_size, seed=cfg.seed)


class PutBack:
  """A prompt iterator with room to put examples back: once a batch of
  them waits, the next batch is theirs (in the order put back), else the
  inner iterator's. RLPR's authors' filter_cache_regenerate: the prompts of
  kept groups past a full batch are sampled again later
  (dynamic_sampling.refill's `put_back`).

    queue = iterator.PutBack()
    prompt_iterator = queue.wrap(factory)   # the loop's hook, as factory's

  state() / restore(): the inner iterator's and the waiting examples'
  uids (resolved in the training set on restore), so a resumed run draws
  what the uninterrupted one would.
  """

  def __init__(self):
    self.inner, self.batch_size, self.queue, self.by_uid = None, 0, [], {}

  def wrap(self, factory=None):
    """The loop's prompt_iterator hook: `factory(cfg, examples)`'s
    iterator (default: `default`'s), with this queue in front."""

    def hook(cfg, examples):
      self.inner = (factory or default)(cfg, examples)
      self.batch_size = cfg.batch_size
      self.by_uid = {e.uid: e for e in examples}
      return self

    return hook

  def put_back(self, examples: Sequence[Example]) -> None:
    self.queue.extend(examples)

  def __iter__(self):
    return self

  def __next__(self) -> list[Example]:
    if len(self.queue) >= self.batch_size:
      batch = self.queue[: self.batch_size]
      self.queue = self.queue[self.batch_size :]
      return batch
    return next(self.inner)

  def state(self) -> dict:
    return {"inner": self.inner.state(), "queued": [e.uid for e in self.queue]}

  def restore(self, state: dict) -> None:
    if "queued" not in state:  # saved without a queue: none waits
      self.inner.restore(state)
      self.queue = []
      return
    missing = [u for u in state["queued"] if u not in self.by_uid]
    if missing:
      raise ValueError(
        f"{len(missing)} prompts put back in the checkpoint (e.g. uid "
        f"{missing[0]!r}) are not in this run's training set: resume with "
        "the data the run was started with"
      )
    self.inner.restore(state["inner"])
    self.queue = [self.by_uid[u] for u in state["queued"]]
