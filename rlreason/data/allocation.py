"""Rollout allocation: more samples for the prompts that need them.

DARS (Depth-Breadth Synergy in RLVR, arXiv:2508.13755) observes that
GRPO's cumulative advantage sum_i |A_i| peaks at medium-accuracy prompts,
so hard prompts get little gradient; it re-samples low-accuracy prompts in
a second stage. With a fixed budget of K extra groups of G per step (fixed
shapes: N = (B + K) * G), `extra_groups` spreads them over the prompts
whose first-stage accuracy is below a threshold:

  equal     (DARS "equal treatment") the same share for every hard prompt;
  hardness  (DARS "hardness weighted") a share proportional to 1 - acc.

The extra groups of a prompt join its first group for the advantage:
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


def extra_groups(
  accuracy: np.ndarray,
  budget: int,
  *,
  threshold: float = 0.5,
  schedule: str = "equal",
) -> np.ndarray:
  """[B] int extra groups per prompt, summing to `budget`.

  Prompts with accuracy < threshold share the budget by the schedule
  (equal, or hardness: weight 1 - acc), largest remainders rounded up
  (ties to the lower index). If no prompt is below the threshold, the
  budget goes to the lowest-accuracy prompts in the same way (the shapes
  stay fixed).

  Example: accuracy [0, 0.25, 1, 0.75], budget 3, equal -> [2, 1, 0, 0].
  """
  acc = np.asarray(accuracy, np.float64)
  if budget <= 0:
    return np.zeros(len(acc), np.int64)
  hard = acc < threshold
  if not hard.any():
    hard = acc <= acc.min()
  if schedule == "equal":
    w = hard.astype(np.float64)
  elif schedule == "hardness":
    w = np.where(hard, 1.0 - acc + 1e-9, 0.0)
  else:
    raise ValueError(f"schedule={schedule!r}: expected equal or hardness")
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
  index: dict = {}
  for i, k in enumerate(keys):
    index.setdefault(k, []).append(i)
  for rows in index.values():
    x = r[rows]
    if len(x) < 2:
      continue
    out[rows] = x - x.mean()
    if scale:
      out[rows] /= x.std(ddof=1) + eps
  return out.astype(np.float32)


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
