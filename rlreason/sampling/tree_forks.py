"""Where a tree rollout forks: the fork points of each expansion round.

Round 1 (`fork_columns`) forks every root chain at its `forks` highest-
entropy tokens (TreeRL's EPTree, ETTRL's entropy fork) or at fixed depths.
Rounds r >= 2 (`pooled_fork_points`) pick, per tree, the `forks` highest-
entropy tokens pooled over every chain the tree has so far (EPTree's
iterations), never a point already used nor a branch's first token; or
fixed depths past the previous round's fork points. rlreason/sampling/tree.py
samples the branches; rlreason/rl/tree_credit.py scores the finished tree.
"""

from typing import Sequence

import numpy as np


def fork_columns(
  entropy: np.ndarray,
  lengths: np.ndarray,
  forks: int,
  *,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
) -> np.ndarray:
  """[N, forks] columns t in [0, len - 1] to fork each chain at (round 1).

  "entropy": the `forks` highest-entropy tokens among columns 0 .. len - 1
  (ties: the earlier column); "depth": `depths` clipped to the chain. A
  chain too short to offer distinct columns repeats its last choice.
  """
  n, _ = entropy.shape
  out = np.zeros((n, forks), np.int32)
  for i in range(n):
    # Columns 0 .. hi - 1: a branch never keeps the stop token, and a
    # fork at 0 resamples from the prompt.
    hi = max(int(lengths[i]), 1)
    if fork_at == "entropy":
      cols = np.arange(hi)
      order = cols[np.argsort(-entropy[i, :hi], kind="stable")]
      pick = list(order[:forks])
    elif fork_at == "depth":
      pick = [min(max(int(d), 0), hi - 1) for d in depths[:forks]] or [0]
    else:
      raise ValueError(f"fork_at={fork_at!r}: expected 'entropy' or 'depth'")
    pick += [pick[-1]] * (forks - len(pick))
    out[i] = sorted(pick)
  return out


def pooled_fork_points(
  entropy: np.ndarray,
  lengths: np.ndarray,
  parent: np.ndarray,
  fork_col: np.ndarray,
  tree_of: np.ndarray,
  level: np.ndarray,
  used: np.ndarray,
  forks: int,
  *,
  round_: int,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
) -> tuple[np.ndarray, np.ndarray]:
  """Fork points of expansion round `round_` >= 2, `forks` per tree.

  Candidates of a tree: every (row, column) a chain of it owns, columns
  fork_col + 1 .. len - 1 of branches (0 .. len - 1 of the root), not in
  `used`. "entropy": the `forks` highest-entropy candidates (ties: lower
  row, then lower column); "depth": fork_col + d for d in `depths` on the
  chains of round `round_` - 1. Too few candidates: the last pick repeats
  (none at all: the root at column 0).

  Args:
    entropy: [n, T] entropy of each row's own tokens.
    lengths, parent, fork_col, tree_of, level: [n] of the rows so far.
    used: [n, T] bool, fork points already taken.
    forks: N, points per tree.

  Returns:
    (rows, cols), each [trees * forks], tree-major, sorted by (row, col)
    within a tree.
  """
  n, t = entropy.shape
  cols = np.arange(t)[None]
  lo = fork_col + (parent >= 0)  # a branch's first token is its own fork
  hi = np.maximum(lengths, 1)
  ok = (cols >= lo[:, None]) & (cols < hi[:, None]) & ~used
  rows_out, cols_out = [], []
  for root in np.flatnonzero(parent < 0):
    rows = np.flatnonzero(tree_of == root)
    if fork_at == "entropy":
      score = np.where(ok[rows], entropy[rows], -np.inf).ravel()
      order = np.argsort(-score, kind="stable")[:forks]
      order = order[np.isfinite(score[order])]
      pick = [(int(rows[k // t]), int(k % t)) for k in order]
    elif fork_at == "depth":
      pick = []
      newest = rows[level[rows] == round_ - 1]
      for d in depths:
        for r in newest:
          c = min(int(fork_col[r]) + max(int(d), 0), int(hi[r]) - 1)
          c = max(c, int(lo[r]))
          if ok[r, min(c, t - 1)] and (r, c) not in pick:
            pick.append((int(r), c))
      pick = pick[:forks]
    else:
      raise ValueError(f"fork_at={fork_at!r}: expected 'entropy' or 'depth'")
    pick = pick or [(int(root), 0)]
    pick += [pick[-1]] * (forks - len(pick))
    for r, c in sorted(pick):
      rows_out.append(r)
      cols_out.append(c)
  return np.asarray(rows_out, np.int64), np.asarray(cols_out, np.int32)
