"""Semantic clustering of a group's answers and semantic-entropy rewards.

EMPO (Zhang et al. 2025, "Right Question is Already Half the Answer: Fully
Unsupervised LLM Reasoning Incentivization", arXiv:2504.05812) minimises
the semantic entropy of the policy's answers on unlabeled prompts. The G
answers of a prompt are clustered by meaning, c_1..c_K with frequencies
p(c_k) = |c_k| / G, and

    H = - sum_k p(c_k) log p(c_k)          (semantic entropy, per prompt)
    r_i = p(c(i))                           (reward of completion i)

so maximising the expected reward pushes probability mass into the largest
meaning cluster, lowering H. A completion without an answer is a cluster
of its own, as in the authors' code (their TRL reward names it 'no answer
{i}', their verl one keeps each '' apart): reward 1/G, and it adds
(1/G) ln G to H, so a group without answers has the largest H, ln G.
Equivalence decides "same meaning": exact match after `extract.normalize`
(procedural tasks), or Math-Verify equivalence for math answers
(`math_equivalence`, pairs of distinct strings checked in the verifier
pool).

Completions are grouped prompt-major: N = B * G.
"""

from typing import Callable, Sequence

import numpy as np

from rlreason.data import extract
from rlreason.rewards import math as math_lib

ExtractFn = Callable[[str], "str | None"]
# (pairs of answer strings) -> [len(pairs)] bool: same meaning?
PairsEquivalent = Callable[[list[tuple[str, str]]], np.ndarray]


def exact_equivalence(pairs: list[tuple[str, str]]) -> np.ndarray:
  """Answers are equivalent iff their normalised strings are equal."""
  return np.array(
    [extract.normalize(a) == extract.normalize(b) for a, b in pairs], bool
  )


def math_equivalence(pairs: list[tuple[str, str]], pool=None) -> np.ndarray:
  """Math-Verify equivalence of each pair, run in the verifier pool."""
  if not pairs:
    return np.zeros(0, bool)
  preds = ["\\boxed{" + a + "}" for a, _ in pairs]
  golds = [b for _, b in pairs]
  return math_lib.math_reward(preds, golds, pool=pool) > 0


def cluster_ids(
  answers: Sequence[str | None],
  group_size: int,
  equivalent: PairsEquivalent = exact_equivalence,
) -> np.ndarray:
  """Cluster index of every answer within its group.

  Identical normalised strings share a cluster without a check; the
  distinct strings of a group are then compared pairwise (one batched
  `equivalent` call for the whole batch) and merged transitively
  (union-find). A missing answer (None) is a cluster of its own. Clusters
  are numbered per group in order of first appearance.

  Args:
    answers: N extracted answers (None = none), groups contiguous.
    group_size: G.
    equivalent: pairs -> [P] bool.

  Returns:
    int32 [N].
  """
  n = len(answers)
  if n % group_size:
    raise ValueError(f"N={n} not divisible by G={group_size}")
  keys = [None if a is None else extract.normalize(a) for a in answers]
  # Distinct strings per group, and the pairs that need a check.
  reps, pairs, where = [], [], []
  for b in range(0, n, group_size):
    distinct = {}
    for i in range(b, b + group_size):
      if keys[i] is not None and keys[i] not in distinct:
        distinct[keys[i]] = answers[i]
    reps.append(list(distinct))
    originals = list(distinct.values())
    for x in range(len(originals)):
      for y in range(x + 1, len(originals)):
        pairs.append((originals[x], originals[y]))
        where.append((b // group_size, x, y))
  same = equivalent(pairs) if pairs else np.zeros(0, bool)
  parent = [list(range(len(r))) for r in reps]

  def find(g, x):
    while parent[g][x] != x:
      parent[g][x] = parent[g][parent[g][x]]
      x = parent[g][x]
    return x

  for (g, x, y), ok in zip(where, same, strict=True):
    if ok:
      rx, ry = find(g, x), find(g, y)
      parent[g][max(rx, ry)] = min(rx, ry)
  out = np.full(n, -1, np.int32)
  for g, r in enumerate(reps):
    index = {k: j for j, k in enumerate(r)}
    roots = {}
    for i in range(g * group_size, (g + 1) * group_size):
      # A missing answer's key is its own index: no other shares it.
      root = ("none", i) if keys[i] is None else find(g, index[keys[i]])
      out[i] = roots.setdefault(root, len(roots))
  return out


def cluster_probabilities(ids: np.ndarray, group_size: int) -> np.ndarray:
  """[N] p(c(i)) = |cluster of i| / G."""
  ids = np.asarray(ids).reshape(-1, group_size)
  same = ids[:, :, None] == ids[:, None, :]
  return (same.sum(-1) / group_size).reshape(-1).astype(np.float32)


def semantic_entropy(ids: np.ndarray, group_size: int) -> np.ndarray:
  """[B] -sum_k p_k log p_k over each group's answer clusters, p_k =
  |c_k| / G."""
  ids = np.asarray(ids).reshape(-1, group_size)
  out = np.zeros(len(ids), np.float32)
  for b, row in enumerate(ids):
    _, counts = np.unique(row, return_counts=True)
    p = counts / group_size
    out[b] = -(p * np.log(p)).sum()
  return out


def semantic_cluster_reward(
  completions: Sequence[str],
  answers=None,
  *,
  group_size: int,
  extract_fn: ExtractFn = extract.extract,
  equivalent: PairsEquivalent = exact_equivalence,
) -> np.ndarray:
  """EMPO reward r_i = p(c(i)) (see module doc). `answers` is ignored."""
  extracted = [extract_fn(c) for c in completions]
  ids = cluster_ids(extracted, group_size, equivalent)
  return cluster_probabilities(ids, group_size)


def entropy_band(
  entropy: np.ndarray, low: float = 0.0, high: float = np.inf
) -> np.ndarray:
  """[B] bool: prompts with low <= H < high (EMPO's entropy thresholding).

  Prompts whose answers are too scattered (H >= high) give an unreliable
  target and are dropped; H = 0 groups have zero advantage anyway.
  """
  entropy = np.asarray(entropy)
  return (entropy >= low) & (entropy < high)
