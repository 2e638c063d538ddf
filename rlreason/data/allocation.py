"""Rollout allocation: more samples for the prompts that need them.

DARS (Depth-Breadth Synergy in RLVR, arXiv:2508.13755) observes that
GRPO's cumulative advantage sum_i |A_i| peaks at medium-accuracy prompts,
so hard prompts get little gradient; it re-samples low-accuracy prompts in
a second stage. The authors' trainer (github.com/yangzhch6/DARS,
ray_dars_trainer.py's resample_func1 / resample_func2) sets a prompt's
total rollouts from its first-stage accuracy p over k = 8 samples:

  p              0    <= 1/8  <= 2/8  <= 3/8  else
  equal (ET)     32   18      11      9       8     (~ k / (4 p (1 - p)))
  hardness (HW)  48   24      12      9       8

so 24 / 10 / 3 / 1 / 0 extra rollouts (ET) or 40 / 16 / 4 / 1 / 0 (HW),
a total that varies with the batch. Here the extra rollouts per step are
a fixed budget (fixed shapes: N = (B + K) * G), and `extra_rollouts`
shares it among the prompts in proportion to those extra counts (scaled
by G / 8 for other group sizes), one rollout at a time.

The extra rollouts of a prompt join its first group for the advantage:
`pooled_advantages` normalises each reward by the mean / std over all the
samples of the same prompt (keys), whatever their number. BroRL
(arXiv:2510.01180) is the other axis: a much larger G for every prompt.

`sample_again(ctx, examples, round_)` samples fresh groups for given
examples (re-sampling, hinted re-sampling) with the current policy and a
key of (seed, step, round), so a resumed run draws the same samples.
"""

from typing import Sequence

import jax
import numpy as np

from rlreason.sampling import draw as sampling_lib

# Keys of sample_again are fold_in(key(seed), _ROUND_BASE + round): apart
# from the loop's (fold_in(key(seed), round) for dynamic sampling).
_ROUND_BASE = 1 << 20


# The authors' total rollouts per prompt at k = 8 first-stage samples, by
# first-stage accuracy bucket: p = 0, <= 1/8, <= 2/8, <= 3/8, above.
DARS_TOTALS = {"equal": (32, 18, 11, 9, 8), "hardness": (48, 24, 12, 9, 8)}
_BUCKETS = (1e-6, 1 / 8 + 1e-6, 2 / 8 + 1e-6, 3 / 8 + 1e-6)


def dars_extra(accuracy: np.ndarray, group_size: int, schedule: str):
  """[B] the authors' extra rollouts per prompt (module docstring's table,
  minus the k first-stage ones), scaled by group_size / 8.

  Example: accuracy [0, 1/8, 2/8, 3/8, 1/2], G 8, equal -> [24, 10, 3, 1, 0].
  """
  if schedule not in DARS_TOTALS:
    raise ValueError(
      f"schedule={schedule!r}: expected one of {sorted(DARS_TOTALS)}"
    )
  totals = np.asarray(DARS_TOTALS[schedule], np.float64) - 8
  bucket = np.searchsorted(_BUCKETS, np.asarray(accuracy, np.float64))
  return totals[bucket] * group_size / 8


def extra_rollouts(
  accuracy: np.ndarray,
  budget: int,
  *,
  group_size: int = 8,
  threshold: float = 0.5,
  schedule: str = "equal",
) -> np.ndarray:
  """[B] int extra rollouts per prompt, summing to `budget`.

  Prompts with accuracy < threshold share the budget in proportion to the
  authors' extra counts (`dars_extra`: 24 / 10 / 3 / 1 at 0, 1/8, 2/8, 3/8
  for ET), largest remainders rounded up (ties to the lower index). If no
  prompt has a share, the budget goes to the lowest-accuracy prompts
  equally (the shapes stay fixed; the authors sample nothing then).

  Example: accuracy [0, 0.25, 1, 0.125], budget 12, G 8, equal: weights
  24, 3, 0, 10 -> shares 7.78, 0.97, 0, 3.24 -> [8, 1, 0, 3].
  """
  acc = np.asarray(accuracy, np.float64)
  w = np.where(acc < threshold, dars_extra(acc, group_size, schedule), 0.0)
  if budget <= 0:
    return np.zeros(len(acc), np.int64)
  if not w.sum() > 0:
    w = (acc <= acc.min()).astype(np.float64)
  share = budget * w / w.sum()
  out = np.floor(share).astype(np.int64)
  rest = share - out
  order = np.lexsort((np.arange(len(acc)), -rest))
  out[order[: budget - out.sum()]] += 1
  return out


def pooled_advantages(
  rewards: np.ndarray,
  keys: Sequence,
  *,
  eps: float = 1e-6,
  scale: bool = True,
) -> np.ndarray:
  """(r_i - mean_k(r)) / (std_k(r) + eps) over all samples with key k.

  GRPO's group normalisation for groups of any size (Bessel-corrected std,
  as advantages.group_normalized; a single sample gets 0). scale=False
  drops the division: r_i - mean_k(r) (the official DARS scripts'
  grpo_use_std=False; Dr. GRPO's form), under which a 0/1 group of n
  samples at accuracy p has cumulative advantage sum_i |A_i| =
  2 n p (1 - p), the quantity DARS's schedules re-balance.

  Args:
    rewards: [N] rewards.
    keys: N hashable keys (e.g. prompt uids).
    eps: added to the std.
    scale: divide by std + eps.
  """
  r = np.asarray(rewards, np.float64)
  out = np.zeros_like(r)
  for rows in _rows_by_key(keys, len(r)):
    x = r[rows]
    if len(x) < 2:
      continue
    out[rows] = x - x.mean()
    if scale:
      out[rows] /= x.std(ddof=1) + eps
  return out.astype(np.float32)


def pooled_means(values: np.ndarray, keys: Sequence) -> np.ndarray:
  """[N] the mean of `values` over all samples with the same key, per
  sample (a prompt's pooled accuracy, first and extra rollouts)."""
  v = np.asarray(values, np.float64)
  out = np.zeros_like(v)
  for rows in _rows_by_key(keys, len(v)):
    out[rows] = v[rows].mean()
  return out


def _rows_by_key(keys: Sequence, n: int) -> list[list[int]]:
  """The row indices of each distinct key, in first-seen order."""
  if len(keys) != n:
    raise ValueError(f"{len(keys)} keys for {n} values")
  index: dict = {}
  for i, k in enumerate(keys):
    index.setdefault(k, []).append(i)
  return list(index.values())


def repeat_for(examples: Sequence, counts: np.ndarray) -> list:
  """examples[i] repeated counts[i] times, in order."""
  return [e for e, c in zip(examples, counts, strict=True) for _ in range(c)]


def sample_again(ctx, examples, round_: int, *, group_size=None):
  """A new rollout of `examples` by the current policy (ctx.params).

  The key is fold_in(key(cfg.seed), 2^20 + round_), folded with ctx.step
  by rollout.generate: deterministic in (seed, step, round).
  """
  cfg = ctx.cfg
  key = jax.random.fold_in(jax.random.key(cfg.seed), _ROUND_BASE + round_)
  return ctx.generate(
    ctx.params,
    list(examples),
    key,
    ctx.step,
    group_size=group_size or cfg.group_size,
    sampling=sampling_lib.Sampling(
      temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k
    ),
  )
