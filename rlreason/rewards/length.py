"""Length-based rewards: DAPO overlong shaping, DLER, LASER(-D, -DE), token
budgets.

Lengths are completion token counts `[N]` supplied by the caller (the reward
never tokenizes). Length limits may be scalars or per-item arrays `[N]`
(difficulty-aware variants). Every function returns float32 [N] and is meant
to be added to a correctness reward with `rewards.combine`; the ones that
depend on correctness take it explicitly as `correct` [N] (1 = correct).
"""

from typing import Sequence

import numpy as np


def _per_item(x, n: int, name: str) -> np.ndarray:
  x = np.asarray(x, np.float32)
  if x.ndim == 0:
    return np.full(n, x, np.float32)
  if x.shape != (n,):
    raise ValueError(f"{name} must be a scalar or [{n}], got {x.shape}")
  return x


def overlong(
  completions: Sequence[str],
  answers=None,
  *,
  lengths,
  max_length,
  buffer_length,
  penalty_factor: float = 1.0,
) -> np.ndarray:
  """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13).

      R(L) = 0                               if L <= Lmax - Lbuf
           = ((Lmax - Lbuf) - L) / Lbuf      if Lmax - Lbuf < L <= Lmax
           = -1                              if L > Lmax
  times `penalty_factor` (verl's `overlong_buffer.penalty_factor`; the paper
  uses 1). verl computes min(-(L - (Lmax - Lbuf)) / Lbuf * f, 0) without the
  -1 floor; the two agree for L <= Lmax, the only lengths a sampler capped
  at Lmax produces.

  Args:
    completions: N completions (only their count is used).
    answers: ignored.
    lengths: [N] completion lengths in tokens.
    max_length: Lmax, scalar or [N].
    buffer_length: Lbuf (> 0), the soft zone before Lmax.
    penalty_factor: scale of the penalty.

  Returns:
    float32 [N] in [-penalty_factor, 0].
  """
  n = len(completions)
  lengths = _per_item(lengths, n, "lengths")
  max_length = _per_item(max_length, n, "max_length")
  if buffer_length <= 0:
    raise ValueError(f"buffer_length must be > 0, got {buffer_length}")
  expected = max_length - buffer_length
  r = np.clip((expected - lengths) / buffer_length, -1.0, 0.0)
  return (penalty_factor * r).astype(np.float32)


def truncation(
  completions: Sequence[str], answers=None, *, lengths, max_length, correct
) -> np.ndarray:
  """DLER truncation penalty (Liu et al. 2025, arXiv 2510.15110).

  R = correct if L <= max_length else 0: a response past the limit earns
  nothing. Use it *instead of* the correctness reward (weight the `math`
  component 0 and pass it as `correct`). A per-item `max_length` [N] gives
  the difficulty-aware variant (tighter limits on easy prompts).
  """
  n = len(completions)
  lengths = _per_item(lengths, n, "lengths")
  correct = _per_item(correct, n, "correct")
  limit = _per_item(max_length, n, "max_length")
  return np.where(lengths <= limit, correct, 0.0).astype(np.float32)


def laser(
  completions: Sequence[str],
  answers=None,
  *,
  lengths,
  target_length,
  correct,
  scale: float = 0.5,
  mode: str = "reward",
) -> np.ndarray:
  """LASER length step reward (Liu et al. 2025, arXiv 2505.15612).

  Only correct responses are shaped (hkust-nlp/Laser `length_penalty.py`,
  default scalar 0.5):
    "reward":  +scale if L <= L_T;
    "penalty": -scale if L > L_T;
    "hybrid":  both.
  Added to the correctness reward C(y). LASER-D passes a per-item
  `target_length` [N], e.g. from `laser_d_targets`.
  """
  n = len(completions)
  lengths = _per_item(lengths, n, "lengths")
  target = _per_item(target_length, n, "target_length")
  correct = _per_item(correct, n, "correct") >= 1.0
  short = lengths <= target
  if mode == "reward":
    r = np.where(short, scale, 0.0)
  elif mode == "penalty":
    r = np.where(short, 0.0, -scale)
  elif mode == "hybrid":
    r = np.where(short, scale, -scale)
  else:
    raise ValueError(f"mode must be reward|penalty|hybrid, got {mode!r}")
  return np.where(correct, r, 0.0).astype(np.float32)


def laser_exploration(
  lengths,
  target_length,
  *,
  correct,
  answered,
  looping,
  scale: float = 0.5,
) -> np.ndarray:
  """LASER-DE's exploration bonus: +scale for a wrong but answered
  response longer than its target that does not loop.

  hkust-nlp/Laser `compute_length_reward_larse_de`: beside LASER-D's step
  reward on correct responses, a response their scorer gives -0.5 (a
  final answer, wrong) earns length_reward_scalar when it exceeds its
  bucket's target and `repetition.loop_start` finds no loop in it, so
  hard prompts keep room to explore longer. Unanswered responses (their
  -1) earn nothing.

  Args:
    lengths, target_length: [N] (or scalar) as for `laser`.
    correct: [N] 1 = correct.
    answered: [N] bool, an answer could be read (extract.extract).
    looping: [N] bool (repetition.loops).
  """
  n = len(np.atleast_1d(np.asarray(correct)))
  lengths = _per_item(lengths, n, "lengths")
  target = _per_item(target_length, n, "target_length")
  wrong = _per_item(correct, n, "correct") < 1.0
  answered = np.asarray(answered, bool).reshape(n)
  looping = np.asarray(looping, bool).reshape(n)
  earns = wrong & answered & (lengths > target) & ~looping
  return np.where(earns, scale, 0.0).astype(np.float32)


def laser_d_targets(
  correct, group_size: int, easy: float, medium: float, hard: float
) -> np.ndarray:
  """Per-item LASER-D target lengths from each prompt's group accuracy.

  Accuracy >= 2/3 -> `easy` (the tightest target), >= 1/3 -> `medium`,
  else `hard` (hkust-nlp/Laser `compute_length_reward_larse_d`). Choosing
  the three lengths adaptively from monitored coverage is left to the
  experiment.

  Args:
    correct: [N] with N = B * G, grouped prompt-major.
    group_size: G.
  Returns:
    float32 [N] target lengths.
  """
  correct = np.asarray(correct, np.float32) >= 1.0
  acc = correct.reshape(-1, group_size).mean(axis=1)  # [B]
  per_prompt = np.where(
    acc >= 2 / 3, easy, np.where(acc >= 1 / 3, medium, hard)
  )
  return np.repeat(per_prompt, group_size).astype(np.float32)


def token_budget(
  completions: Sequence[str],
  answers=None,
  *,
  lengths,
  budget,
  alpha: float = 3e-4,
  mode: str = "exceed",
) -> np.ndarray:
  """Token-budget penalty.

    "exceed": -alpha * max(0, L - budget)   (only overshoot costs);
    "abs":    -alpha * |L - budget|         (L1-Exact, Aggarwal & Welleck
                                             2025, arXiv 2503.04697, with
                                             their alpha = 3e-4).
  `budget` is a scalar or a per-prompt [N] array (e.g. parsed from a
  "think for B tokens" instruction).
  """
  n = len(completions)
  lengths = _per_item(lengths, n, "lengths")
  budget = _per_item(budget, n, "budget")
  if mode == "exceed":
    r = -alpha * np.maximum(lengths - budget, 0.0)
  elif mode == "abs":
    r = -alpha * np.abs(lengths - budget)
  else:
    raise ValueError(f"mode must be exceed|abs, got {mode!r}")
  return r.astype(np.float32)


# LASER-D difficulty buckets: accuracy >= 2/3 (easy), >= 1/3, else (hard).
LASER_D_BUCKETS = ("easy", "medium", "hard")


def laser_d_adaptive_targets(
  lengths,
  correct,
  group_size: int,
  thresholds,
  *,
  expected_correct: int = 1,
) -> dict[str, float]:
  """LASER-D's adaptive target length of each difficulty bucket.

  hkust-nlp/Laser `_choose_target_length` (round_method="floor"): for
  bucket l with n_l = floor(2G/3) (easy), floor(G/3) (medium) or 1 (hard),
  the target is the smallest threshold L below the batch's longest
  response such that

      floor(coverage_l(L) * n_l) >= expected_correct,

  where coverage_l(L) is the fraction of bucket-l responses, right or
  wrong, at most L tokens long (their monitor's
  `_calculate_length_coverage_statistics`): n_l is the fewest correct
  responses a bucket-l prompt has, so coverage * n_l estimates how many of
  them a cut at L keeps. The batch's longest response is the target when
  no threshold qualifies or the bucket is empty (their
  max_response_length). Easy prompts thus get tight targets and hard ones
  keep the budget. The authors measure coverage on a monitoring set every
  few steps; here it is measured on whatever batch is passed.

  Args:
    lengths: [N] response lengths, N = B * G prompt-major.
    correct: [N] 0/1.
    group_size: G.
    thresholds: candidate target lengths (any order).
    expected_correct: the expected correct responses a target must keep.

  Returns:
    {"easy": L, "medium": L, "hard": L}.
  """
  lengths = np.asarray(lengths, np.float32).reshape(-1, group_size)
  correct = np.asarray(correct, np.float32).reshape(-1, group_size) >= 1.0
  acc = correct.mean(-1)
  bucket = np.where(acc >= 2 / 3, 0, np.where(acc >= 1 / 3, 1, 2))
  lower_n = (int(group_size * 2 / 3), int(group_size / 3), 1)
  longest = float(lengths.max())
  targets = {}
  for k, name in enumerate(LASER_D_BUCKETS):
    sel = bucket == k
    targets[name] = longest
    if not sel.any():
      continue
    for length in sorted(t for t in thresholds if t < longest):
      coverage = (lengths[sel] <= length).mean()
      if int(coverage * lower_n[k]) >= expected_correct:
        targets[name] = float(length)
        break
  return targets


def laser_d_bucket_targets(
  correct, group_size: int, targets: dict[str, float]
) -> np.ndarray:
  """[N] per-response target lengths from `laser_d_adaptive_targets`."""
  return laser_d_targets(
    correct,
    group_size,
    easy=targets["easy"],
    medium=targets["medium"],
    hard=targets["hard"],
  )
