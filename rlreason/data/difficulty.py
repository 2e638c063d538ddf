"""Difficulty tracking: per-prompt and per-source running success statistics.

Many methods decide what to sample from how the policy has been doing:
curricula (ADCL, arXiv:2505.08364), distribution-level UCB (DUMP,
arXiv:2504.09710), rollout allocation (DARS, arXiv:2508.13755), hints for
hard prompts (GHPO, POPE, SEELE) and skipping solved prompts (dynamic
sampling before the rollout). They share one host-side record:

  tracker = difficulty.Tracker(decay=0.5)
  make_batch = difficulty.tracking(make_batch, tracker)   # updates it
  prompt_iterator = difficulty.prompts(tracker, weights)  # samples by it

`Tracker` keeps, per prompt uid, the attempts, the successes and an
exponential moving average of the group accuracy (`decay` weighs the old
value; the first observation sets it), and per source (e.g. task and
difficulty, `source_of(uid)`) the same plus a sliding window of a
learnability signal (DUMP: mean |advantage|). Per-prompt notes
(`note`/`notes`) hold small method state, e.g. SEELE's (hint ratio,
accuracy) history. Its `state()` is JSON, and `AdaptivePrompts` puts it in
the prompt iterator's state, which the loop saves with every checkpoint:
a resumed run samples and allocates exactly as the uninterrupted one.

`AdaptivePrompts` draws batch k without replacement with probabilities
proportional to `weights(tracker, examples)` and a generator seeded by
(seed, k): deterministic in (seed, k, tracker state). Weight functions:
`target_weights` (a curriculum around a target accuracy), `skip_solved`
(pre-rollout dynamic sampling), `ucb_source_weights` (DUMP).
"""

import collections
import math
from typing import Callable, Sequence

import numpy as np


def default_source(uid: str) -> str:
  """'arithmetic-d2-0a1b..' -> 'arithmetic-d2' (a task uid's task and
  difficulty); other uids: the text before the last '-' or ':'."""
  for sep in ("-", ":"):
    if sep in uid:
      return uid.rsplit(sep, 1)[0]
  return ""


class Tracker:
  """Running success statistics per prompt uid and per source.

  Args:
    decay: EMA weight of the previous accuracy (0: the last group only).
    window: length of each source's signal window (DUMP's k).
    source_of: uid -> source name.
  """

  def __init__(
    self,
    *,
    decay: float = 0.5,
    window: int = 64,
    source_of: Callable[[str], str] = default_source,
  ):
    if not 0 <= decay < 1:
      raise ValueError(f"decay={decay} must be in [0, 1)")
    self.decay, self.window, self.source_of = decay, window, source_of
    # uid -> [attempts, successes, ema accuracy, groups seen]
    self.prompts: dict[str, list[float]] = {}
    # source -> [attempts, successes, groups seen]
    self.sources: dict[str, list[float]] = {}
    self.signals: dict[str, collections.deque] = {}
    self.extra: dict[str, dict] = {}

  def update(
    self,
    uids: Sequence[str],
    correct: np.ndarray,
    signal: np.ndarray | None = None,
  ) -> None:
    """Adds one round of samples: uids [N] with correctness [N] (0/1).

    The samples of a uid in one call form one group: its accuracy enters
    the EMA once. `signal` [N] (e.g. |advantage|), if given, enters its
    source's window sample by sample (DUMP's authors' window of the last
    `window` samples' |advantage|).
    """
    correct = np.asarray(correct, np.float64)
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
      groups.setdefault(uid, []).append(i)
    for uid, rows in groups.items():
      n, s = len(rows), float(correct[rows].sum())
      rec = self.prompts.get(uid)
      if rec is None:
        self.prompts[uid] = [n, s, s / n, 1]
      else:
        rec[0] += n
        rec[1] += s
        rec[2] = self.decay * rec[2] + (1 - self.decay) * s / n
        rec[3] += 1
      src = self.source_of(uid)
      srec = self.sources.setdefault(src, [0, 0, 0])
      srec[0] += n
      srec[1] += s
      srec[2] += 1
      if signal is not None:
        win = self.signals.setdefault(
          src, collections.deque(maxlen=self.window)
        )
        win.extend(float(x) for x in np.asarray(signal)[rows])

  def accuracy(self, uid: str, default: float = math.nan) -> float:
    """The EMA accuracy of a prompt, `default` if never seen."""
    rec = self.prompts.get(uid)
    return default if rec is None else rec[2]

  def accuracies(self, uids: Sequence[str], default=math.nan) -> np.ndarray:
    return np.asarray([self.accuracy(u, default) for u in uids], np.float64)

  def attempts(self, uid: str) -> int:
    rec = self.prompts.get(uid)
    return 0 if rec is None else int(rec[0])

  def source_stats(self, source: str) -> tuple[int, float, float]:
    """(samples drawn, mean accuracy, window mean of the signal) of a
    source; (0, nan, nan) if never seen (nan signal: no signal yet)."""
    rec = self.sources.get(source)
    if rec is None:
      return 0, math.nan, math.nan
    win = self.signals.get(source)
    sig = float(np.mean(win)) if win else math.nan
    return int(rec[0]), rec[1] / max(rec[0], 1), sig

  def note(self, uid: str, key: str, value) -> None:
    """Stores a JSON value for a prompt (method state, checkpointed)."""
    self.extra.setdefault(uid, {})[key] = value

  def notes(self, uid: str, key: str, default=None):
    return self.extra.get(uid, {}).get(key, default)

  def metrics(self) -> dict[str, float]:
    """Summary for the step's metrics row."""
    acc = [r[2] for r in self.prompts.values()]
    out = {"difficulty/prompts_seen": float(len(acc))}
    if acc:
      out["difficulty/mean_accuracy"] = float(np.mean(acc))
      out["difficulty/solved"] = float(np.mean(np.asarray(acc) >= 1.0))
      out["difficulty/unsolved"] = float(np.mean(np.asarray(acc) <= 0.0))
    return out

  def state(self) -> dict:
    return {
      "prompts": {k: list(v) for k, v in self.prompts.items()},
      "sources": {k: list(v) for k, v in self.sources.items()},
      "signals": {k: list(v) for k, v in self.signals.items()},
      "extra": self.extra,
    }

  def restore(self, state: dict) -> None:
    self.prompts = {k: list(v) for k, v in state["prompts"].items()}
    self.sources = {k: list(v) for k, v in state["sources"].items()}
    self.signals = {
      k: collections.deque(v, maxlen=self.window)
      for k, v in state["signals"].items()
    }
    self.extra = {k: dict(v) for k, v in state["extra"].items()}


def tracking(make_batch: Callable, tracker: Tracker) -> Callable:
  """Wraps make_batch: every rollout it sees updates `tracker`.

  Correctness is the 0/1 verifier (ctx.correct_fn) on the examples as
  given (a hinted example counts for its uid); the signal is the row's
  mean |advantage| (DUMP's learnability). Wrap the per-round make_batch
  (inside dynamic_sampling.refill), so every round counts.
  """

  def wrapped(rollout, examples, ctx):
    batch, metrics = make_batch(rollout, examples, ctx)
    gold = [examples[i].answer for i in rollout.prompt_ids]
    correct = np.asarray(ctx.correct_fn(rollout.texts, gold), np.float64)
    adv = np.abs(np.asarray(batch["adv"], np.float64))
    if adv.ndim == 2:  # token advantages: the mean over completion tokens
      mask = np.asarray(batch["mask"], np.float64)
      adv = (adv * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    uids = [examples[i].uid for i in rollout.prompt_ids]
    tracker.update(uids, correct, adv[: len(uids)])
    return batch, {**metrics, **tracker.metrics()}

  return wrapped


# ------------------------------------------------------------------ weights


def target_weights(
  target: float = 0.5,
  width: float = 0.25,
  unseen: float = 1.0,
  *,
  source_prior: bool = False,
) -> Callable:
  """Weights exp(-((acc - target) / width)^2); `unseen` for new prompts.

  A curriculum that keeps the batch near `target` accuracy (ADCL's
  "appropriate difficulty"), re-estimated as the policy improves. With
  `source_prior`, a prompt never drawn is estimated by its source's mean
  accuracy (when the source has been seen), so whole difficulty levels
  move in and out of the batch.
  """

  def weights(tracker, examples):
    acc = tracker.accuracies([e.uid for e in examples])
    if source_prior:
      prior = {}
      for i in np.flatnonzero(np.isnan(acc)):
        src = tracker.source_of(examples[i].uid)
        if src not in prior:
          n, mean, _ = tracker.source_stats(src)
          prior[src] = mean if n else math.nan
        acc[i] = prior[src]
    w = np.exp(-(((acc - target) / width) ** 2))
    return np.where(np.isnan(acc), unseen, w)

  return weights


def skip_solved(threshold: float = 1.0, min_groups: int = 1) -> Callable:
  """Weight 0 for prompts whose EMA accuracy >= threshold after at least
  `min_groups` groups, else 1: dynamic sampling before the rollout."""

  def weights(tracker, examples):
    out = np.ones(len(examples))
    for i, e in enumerate(examples):
      rec = tracker.prompts.get(e.uid)
      if rec is not None and rec[3] >= min_groups and rec[2] >= threshold:
        out[i] = 0.0
    return out

  return weights


def ucb_scores(
  signal: np.ndarray, counts: np.ndarray, c: float = 1.0
) -> np.ndarray:
  """DUMP's UCB: L_j + c * sqrt(2 ln(sum_k n_k + 1) / (n_j + 1)), as the
  authors' curriculum_learning.py (the +1s keep an unseen source finite).

  Args:
    signal: [J] expected learnability L_j (window mean |advantage|); nan
      for a source never scored (0, the authors' starting mean).
    counts: [J] samples drawn from each source, n_j.
    c: exploration weight.

  Returns:
    [J] scores.
  """
  signal, counts = np.asarray(signal, float), np.asarray(counts, float)
  total = max(counts.sum(), 1.0)
  bonus = c * np.sqrt(2 * np.log(total + 1) / (counts + 1))
  return np.where(np.isnan(signal), 0.0, signal) + bonus


def source_probs(scores: np.ndarray, temperature: float) -> np.ndarray:
  """softmax(scores / temperature); the +inf sources share all the mass."""
  scores = np.asarray(scores, float)
  inf = np.isinf(scores)
  if inf.any():
    return inf / inf.sum()
  z = scores / temperature
  z = np.exp(z - z.max())
  return z / z.sum()


def ucb_source_weights(c: float = 1.0, temperature: float = 0.1) -> Callable:
  """DUMP: P(source) = softmax(UCB / temperature), spread evenly over the
  source's prompts."""

  def weights(tracker, examples):
    names = [tracker.source_of(e.uid) for e in examples]
    sources = sorted(set(names))
    stats = [tracker.source_stats(s) for s in sources]
    scores = ucb_scores([s[2] for s in stats], [s[0] for s in stats], c)
    probs = dict(zip(sources, source_probs(scores, temperature)))
    size = collections.Counter(names)
    return np.asarray([probs[s] / size[s] for s in names])

  return weights


# ------------------------------------------------------------------ sampler


class AdaptivePrompts:
  """Prompt batches drawn by tracker-dependent weights (module doc).

  Args:
    examples: the training examples.
    batch_size: prompts per batch.
    tracker: the run's Tracker (its state is part of this iterator's).
    weights: (tracker, examples) -> [len(examples)] non-negative weights.
    seed: batch k draws with numpy default_rng([seed, k]).
  """

  def __init__(self, examples, batch_size, tracker, weights, *, seed=0):
    if len(examples) < batch_size:
      raise ValueError(f"{len(examples)} examples < batch {batch_size}")
    self.examples = list(examples)
    self.batch_size, self.tracker = batch_size, tracker
    self.weights, self.seed, self.drawn = weights, seed, 0

  def probabilities(self) -> np.ndarray:
    """[len(examples)] sampling probabilities of the next batch.

    Every prompt keeps a floor of 1e-6 of the largest weight, so a batch
    can always be drawn without replacement.
    """
    w = np.asarray(self.weights(self.tracker, self.examples), np.float64)
    w = np.where(np.isfinite(w) & (w > 0), w, 0.0)
    w = np.maximum(w, 1e-6 * max(w.max(), 1e-12))
    return w / w.sum()

  def __iter__(self):
    return self

  def __next__(self):
    rng = np.random.default_rng([self.seed, self.drawn])
    idx = rng.choice(
      len(self.examples), self.batch_size, replace=False, p=self.probabilities()
    )
    self.drawn += 1
    return [self.examples[i] for i in idx]

  def state(self) -> dict:
    return {"drawn": self.drawn, "tracker": self.tracker.state()}

  def restore(self, state: dict) -> None:
    self.drawn = int(state["drawn"])
    self.tracker.restore(state["tracker"])


def prompts(tracker: Tracker, weights: Callable) -> Callable:
  """A loop.train(prompt_iterator=...) factory sampling with `weights`."""

  def factory(cfg, examples):
    return AdaptivePrompts(
      examples, cfg.batch_size, tracker, weights, seed=cfg.seed
    )

  return factory


def tracked_iterator(tracker: Tracker, base: Callable | None = None):
  """A prompt_iterator factory that keeps `base`'s order (default: the
  loop's iterator.default) and checkpoints `tracker` with it (any
  host state with state() -> JSON data and restore(state), e.g. T-PPO's
  in-flight slots)."""
  from rlreason.data import iterator

  def factory(cfg, examples):
    return _WithTracker((base or iterator.default)(cfg, examples), tracker)

  return factory


class _WithTracker:
  def __init__(self, inner, tracker):
    self.inner, self.tracker = inner, tracker

  def __iter__(self):
    return self

  def __next__(self):
    return next(self.inner)

  def state(self) -> dict:
    return {"inner": self.inner.state(), "tracker": self.tracker.state()}

  def restore(self, state: dict) -> None:
    if "inner" not in state:  # from before the tracker was kept: it starts
      self.inner.restore(state)  # afresh (an experiment that added one)
      return
    self.inner.restore(state["inner"])
    self.tracker.restore(state["tracker"])
