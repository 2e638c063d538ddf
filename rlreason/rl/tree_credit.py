"""Tree credit assignment: TreeRL's process advantages from subtree outcomes.

  adv = tree_credit.tree_advantages(rewards, tr.parent, tr.fork_col,
                                    np.asarray(tr.mask), tr.prompt_ids)

Works on a finished tree.TreeRollout's rewards (host numpy), not on how it
was sampled. TreeRL (Hou et al. 2025, arXiv:2506.11902, Sec. 3.2): the
tree's nodes s are spans of tokens between fork points; with L(s) the
leaves (rows) below s and r the leaves' outcome rewards,

  V(s) = mean_{l in L(s)} r_l                      (subtree value)
  A(s) = [(V(s) - V(root)) + (V(s) - V(parent(s)))] / sqrt(|L(s)|)

global + local advantage, every token of s gets A(s); the 1/sqrt(|L(s)|)
keeps shared prefixes, which many leaves vote on, from dominating. The
authors (THUDM/TreeRL) train every leaf's root-to-leaf path as a row, so
a token of s is in |L(s)| rows; here each token is in one row (its
owner's), and `path_lengths` weights it by the rows it stands for.
V(root) is the prompt's mean reward over all its trees (the virtual root
above the M chains), so a root's first node has local = global advantage.
No std normalisation (the paper's).

Nodes at any depth: row r owns columns [fork_col[r], len) and is cut into
nodes at its children's fork columns; node [a, b) of r has the leaves
{r} + the subtrees of r's children forked at column >= b (they share r's
tokens up to b).

Shapes: N rows (leaves), T completion length.
"""

import numpy as np


def tree_advantages(
  rewards: np.ndarray,
  parent: np.ndarray,
  fork_col: np.ndarray,
  mask: np.ndarray,
  prompt_ids: np.ndarray,
  *,
  scale_by_leaves: bool = True,
  path_lengths: np.ndarray | None = None,
  trained: np.ndarray | None = None,
) -> np.ndarray:
  """TreeRL's process advantages A(s) (module docstring), per token.

  parent(s) of row r's first node is the node holding column
  fork_col[r] - 1: the nearest ancestor whose own span contains it (the
  virtual root when fork_col[r] = 0); of a later node, r's node before it.

  Args:
    rewards: [N] outcome reward of each row (leaf).
    parent: [N] parent row, -1 for roots (TreeRollout.parent).
    fork_col: [N] first own column of each row.
    mask: [N, T] owned tokens (TreeRollout.mask).
    prompt_ids: [N] prompt of each row.
    scale_by_leaves: divide by sqrt(|L(s)|) (TreeRL); False: not.
    path_lengths: [N] completion tokens of each leaf's whole path (shared
      prefix included, TreeRollout.mask_full's row sums), or None. Given,
      a token of node s is weighted by sum_{l in L(s)} 1 / path_lengths[l]:
      trained once, it carries what the authors' update gives it, where
      every leaf's whole path is a row and each row is averaged over its
      tokens. With aggregation "seq-mean-token-sum" (sum over tokens /
      rows) the loss is then theirs: mean over leaves of the mean of A
      along the leaf's path (`test_path_weights_are_the_leaf_rows_loss`).
    trained: [N] bool, the leaves whose paths are trained (the authors'
      subset, `select_leaves`), or None (all). With path_lengths, the sum
      runs over L(s)'s trained leaves only (V still counts every leaf).

  Returns:
    [N, T] float32 advantages, 0 where mask = 0.
  """
  if trained is not None and path_lengths is None:
    raise ValueError("trained leaves weight paths: pass path_lengths too")
  rewards = np.asarray(rewards, np.float64)
  n, t = mask.shape
  children = [[] for _ in range(n)]
  for r in range(n):
    if parent[r] >= 0:
      children[parent[r]].append(r)
  memo = {}

  def below(r):  # all rows in r's subtree (r included)
    if r not in memo:
      memo[r] = [r] + [x for q in children[r] for x in below(q)]
    return memo[r]

  def leaves(r, end):  # leaves sharing row r's tokens [.., end)
    return [r] + [
      x for q in children[r] if fork_col[q] >= end for x in below(q)
    ]

  root_v = {p: rewards[prompt_ids == p].mean() for p in set(prompt_ids)}
  adv = np.zeros((n, t), np.float32)
  for r in range(n):
    cuts = sorted({int(fork_col[r])} | {int(fork_col[q]) for q in children[r]})
    cuts = [c for c in cuts if c < t] + [t]
    f, prev_v = int(fork_col[r]), None
    if parent[r] >= 0 and f > 0:  # a fork at 0 hangs off the root
      owner = parent[r]  # the ancestor that sampled column f - 1
      while fork_col[owner] >= f and parent[owner] >= 0:
        owner = parent[owner]
      prev_v = rewards[leaves(owner, f)].mean()
    for a, b in zip(cuts[:-1], cuts[1:]):
      lv = leaves(r, b)
      v = rewards[lv].mean()
      vr = root_v[prompt_ids[r]]
      vp = vr if prev_v is None else prev_v
      a_s = (v - vr) + (v - vp)
      if scale_by_leaves:
        a_s /= np.sqrt(len(lv))
      if path_lengths is not None:
        kept = lv if trained is None else [x for x in lv if trained[x]]
        a_s *= np.sum(1.0 / np.maximum(np.asarray(path_lengths)[kept], 1))
      adv[r, a:b] = a_s
      prev_v = v
  return adv * (np.asarray(mask) > 0)


def select_leaves(
  correct: np.ndarray, prompt_ids: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
  """[N] bool: k leaves of each prompt whose paths are trained, as the
  authors' select_terminal (THUDM/TreeRL tree_node.py, balance_ratio 0):
  one correct leaf when the prompt has any (drawn at random among them),
  the rest uniformly without replacement from its other leaves.

  Args:
    correct: [N] 0/1 verifier outcome of each leaf.
    prompt_ids: [N] prompt of each leaf.
    k: leaves kept per prompt (at most its leaf count).
    rng: the draw's generator.
  """
  correct = np.asarray(correct) > 0
  out = np.zeros(len(correct), bool)
  for p in np.unique(prompt_ids):
    rows = np.flatnonzero(prompt_ids == p)
    if k > len(rows):
      raise ValueError(f"{k} trained leaves of a prompt with {len(rows)}")
    rows = rng.permutation(rows)
    hit = [r for r in rows if correct[r]]
    first = hit[:1]
    rest = [r for r in rows if r not in first]
    out[first] = True
    out[rng.choice(rest, k - len(first), replace=False)] = True
  return out
