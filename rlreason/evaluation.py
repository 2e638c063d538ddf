"""Evaluation metrics over n samples per problem: pass@k, maj@k, mean@k.

Scores are per problem, then averaged over problems with a 95% confidence
interval (normal approximation over problems; Wilson for 0/1 accuracies).

  pass@k  unbiased estimator of P(at least one of k samples is correct) from
          n >= k samples with c correct (Chen et al. 2021, arXiv:2107.03374,
          Eq. 1): 1 - C(n - c, k) / C(n, k).
  maj@k   the majority answer among the first k samples is correct. Ties go
          to the answer seen first; unparsed answers (None) do not vote.
  mean@k  mean correctness of the first k samples (avg@k in some papers).
"""

import collections
import math
from typing import Hashable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k for one problem with n samples, c of them correct."""
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  # 1 - prod_{i=n-c+1}^{n} (1 - k / i): the binomial ratio without overflow.
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority(answers: Sequence[Hashable | None]) -> Hashable | None:
  """Most frequent non-None answer; ties go to the one that appears first."""
  counts = collections.Counter(a for a in answers if a is not None)
  if not counts:
    return None
  best = max(counts.values())
  return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(
  answers: Sequence[Hashable | None], correct: Sequence[bool], k: int
) -> float:
  """1.0 if the majority answer of the first k samples is a correct one."""
  if len(answers) != len(correct):
    raise ValueError("maj_at_k: answers and correct differ in length")
  if not 1 <= k <= len(answers):
    raise ValueError(f"maj_at_k: need 1 <= k <= {len(answers)}, got {k}")
  vote = majority(answers[:k])
  if vote is None:
    return 0.0
  return float(any(c for a, c in zip(answers[:k], correct[:k]) if a == vote))


def mean_at_k(correct: Sequence[float], k: int) -> float:
  if not 1 <= k <= len(correct):
    raise ValueError(f"mean_at_k: need 1 <= k <= {len(correct)}, got {k}")
  return float(np.mean(np.asarray(correct[:k], np.float64)))


def mean_ci(values: Sequence[float], z: float = 1.96):
  """(mean, low, high): normal-approximation interval over problems.

  For 0/1 values the Wilson score interval is used (sensible at 0 and 1).
  """
  v = np.asarray(values, np.float64)
  n = v.size
  if n == 0:
    return float("nan"), float("nan"), float("nan")
  m = float(v.mean())
  if np.isin(v, (0.0, 1.0)).all():
    denom = 1 + z * z / n
    centre = (m + z * z / (2 * n)) / denom
    half = z * math.sqrt(m * (1 - m) / n + z * z / (4 * n * n)) / denom
    return m, centre - half, centre + half
  se = float(v.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
  return m, m - z * se, m + z * se


def summarize(
  correct: np.ndarray,
  answers: Sequence[Sequence] | None = None,
  ks: Sequence[int] = (1,),
) -> dict[str, tuple[float, float, float]]:
  """Per-metric (mean, low, high) over problems.

  Args:
    correct: [B, n] 0/1 correctness of n samples for each of B problems.
    answers: B lists of n extracted answers (for maj@k); None skips maj@k.
    ks: the k values to report (each <= n).
  """
  correct = np.asarray(correct, np.float64)
  b, n = correct.shape
  out = {}
  for k in ks:
    if k > n:
      continue
    out[f"pass@{k}"] = mean_ci([pass_at_k(n, int(c.sum()), k) for c in correct])
    out[f"mean@{k}"] = mean_ci([mean_at_k(c, k) for c in correct])
    if answers is not None:
      out[f"maj@{k}"] = mean_ci(
        [maj_at_k(a, c, k) for a, c in zip(answers, correct)]
      )
  return out


def markdown_table(
  rows: dict[str, dict[str, tuple[float, float, float]]],
) -> str:
  """{row name: summarize(...)} -> a markdown table of mean [low, high]."""
  metrics = sorted(
    {m for r in rows.values() for m in r},
    key=lambda m: (m.split("@")[0], int(m.split("@")[1])),
  )
  lines = ["| | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
  for name, r in rows.items():
    cells = [
      f"{100 * r[m][0]:.1f} [{100 * r[m][1]:.1f}, {100 * r[m][2]:.1f}]"
      if m in r
      else ""
      for m in metrics
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
