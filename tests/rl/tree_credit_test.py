"""Tree credit: TreeRL's subtree-value advantages, hand-computed."""

import numpy as np
import pytest

from rlreason.rl import tree_credit


def test_tree_advantages_hand_computed():
  # One prompt. Root 0 (reward 1) forks: row 1 at col 2 (reward 0), row 2 at
  # col 4 (reward 0). Root 3 (reward 1), no forks. T = 6, all full length.
  parent = np.array([-1, 0, 0, -1])
  fork = np.array([0, 2, 4, 0])
  r = np.array([1.0, 0.0, 0.0, 1.0])
  mask = (np.arange(6)[None] >= fork[:, None]).astype(np.int32)
  adv = tree_credit.tree_advantages(r, parent, fork, mask, np.zeros(4, int))
  vroot = 0.5
  # Row 0 segments: [0,2) leaves {0,1,2} V=1/3; [2,4) leaves {0,2} V=1/2;
  # [4,6) leaves {0} V=1.
  a0 = (2 * (1 / 3) - 2 * vroot) / np.sqrt(3)
  a1 = ((0.5 - vroot) + (0.5 - 1 / 3)) / np.sqrt(2)
  a2 = (1 - vroot) + (1 - 0.5)
  np.testing.assert_allclose(
    adv[0], [a0, a0, a1, a1, a2, a2], rtol=1e-6, atol=1e-6
  )
  # Row 1 (parent node: row 0's [0,2), V=1/3): V=0.
  b = (0 - vroot) + (0 - 1 / 3)
  np.testing.assert_allclose(adv[1], [0, 0, b, b, b, b], rtol=1e-6, atol=1e-6)
  # Row 2 (parent node: row 0's [2,4), V=1/2).
  c = (0 - vroot) + (0 - 0.5)
  np.testing.assert_allclose(adv[2], [0, 0, 0, 0, c, c], rtol=1e-6, atol=1e-6)
  # 2*(1-.5)
  np.testing.assert_allclose(adv[3], [1.0] * 6, rtol=1e-6, atol=1e-6)


def test_tree_advantages_two_levels_hand_computed():
  # One prompt, T = 8. Root 0 (r=1) has round-1 branches 1 (col 2, r=0) and
  # 2 (col 5, r=1); round 2 forks branch 1 at col 4 (row 3, r=1) and the
  # root again at col 6 (row 4, r=0). Root 5 (r=0) has no branches.
  parent = np.array([-1, 0, 0, 1, 0, -1])
  fork = np.array([0, 2, 5, 4, 6, 0])
  r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  mask = (np.arange(8)[None] >= fork[:, None]).astype(np.int32)
  adv = tree_credit.tree_advantages(r, parent, fork, mask, np.zeros(6, int))
  vr = 0.5  # 3 of 6 leaves correct
  a = lambda v, vp, n: ((v - vr) + (v - vp)) / np.sqrt(n)
  # Row 0 nodes: [0,2) leaves {0,1,3,2,4} V=3/5; [2,5) {0,2,4} V=2/3;
  # [5,6) {0,4} V=1/2; [6,8) {0} V=1.
  row0 = [a(0.6, vr, 5)] * 2 + [a(2 / 3, 0.6, 3)] * 3
  row0 += [a(0.5, 2 / 3, 2)] + [a(1.0, 0.5, 1)] * 2
  np.testing.assert_allclose(adv[0], row0, rtol=1e-6, atol=1e-6)
  # Row 1 (parent node row 0 [0,2), V=3/5): [2,4) {1,3} V=1/2; [4,8) {1} V=0.
  row1 = [0, 0] + [a(0.5, 0.6, 2)] * 2 + [a(0.0, 0.5, 1)] * 4
  np.testing.assert_allclose(adv[1], row1, rtol=1e-6, atol=1e-6)
  # Row 3 hangs off row 1's [2,4) (V=1/2); row 2 off row 0's [2,5) (V=2/3);
  # row 4 off row 0's [5,6) (V=1/2); root 5 off the virtual root.
  np.testing.assert_allclose(
    adv[3], [0] * 4 + [a(1.0, 0.5, 1)] * 4, rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    adv[2], [0] * 5 + [a(1.0, 2 / 3, 1)] * 3, rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    adv[4], [0] * 6 + [a(0.0, 0.5, 1)] * 2, rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(adv[5], [a(0.0, vr, 1)] * 8, rtol=1e-6, atol=1e-6)


def test_tree_advantages_fork_at_a_branch_start_is_the_parents_fork():
  # Row 2 forks branch 1 at branch 1's first own column (3): it shares
  # only the root's tokens [0, 3), the same tree as forking the root there.
  r = np.array([1.0, 0.0, 1.0])
  fork = np.array([0, 3, 3])
  mask = (np.arange(6)[None] >= fork[:, None]).astype(np.int32)
  ids = np.zeros(3, int)
  nested = tree_credit.tree_advantages(r, np.array([-1, 0, 1]), fork, mask, ids)
  flat = tree_credit.tree_advantages(r, np.array([-1, 0, 0]), fork, mask, ids)
  np.testing.assert_allclose(nested, flat, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(nested.sum(-1) != 0, [True, True, True])


def test_path_weights_are_the_leaf_rows_loss():
  """Each token trained once, weighted by sum_{l in L(s)} 1 / |path_l|,
  summed and divided by the rows, is the authors' loss: every leaf's whole
  path a row, A averaged along each row, then over the rows."""
  parent = np.array([-1, 0, 0, 1, 0, -1])  # the two-level tree above
  fork = np.array([0, 2, 5, 4, 6, 0])
  r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  lengths = np.array([8, 7, 6, 8, 7, 5])  # whole paths end at their length
  cols = np.arange(8)[None]
  mask = ((cols >= fork[:, None]) & (cols < lengths[:, None])).astype(int)
  ids = np.zeros(6, int)
  plain = tree_credit.tree_advantages(r, parent, fork, mask, ids)
  weighted = tree_credit.tree_advantages(
    r, parent, fork, mask, ids, path_lengths=lengths
  )

  def owner(leaf, c):  # the row that sampled column c of the leaf's path
    while fork[leaf] > c:
      leaf = parent[leaf]
    return leaf

  rows = [
    np.mean([plain[owner(leaf, c), c] for c in range(lengths[leaf])])
    for leaf in range(6)
  ]
  np.testing.assert_allclose(
    (weighted * mask).sum() / 6, np.mean(rows), rtol=1e-5, atol=1e-6
  )
  # By hand: row 0's first node [0, 2) stands for leaves {0, 1, 3, 2, 4}.
  w = 1 / 8 + 1 / 7 + 1 / 8 + 1 / 6 + 1 / 7
  np.testing.assert_allclose(
    weighted[0, :2], plain[0, :2] * w, rtol=1e-6, atol=1e-6
  )
  # Row 5 (no branches) stands for itself alone.
  np.testing.assert_allclose(
    weighted[5, :5], plain[5, :5] / 5, rtol=1e-6, atol=1e-6
  )


def test_trained_leaves_are_the_subset_rows_loss():
  """The authors train K of a prompt's leaves: with `trained`, each token
  weighted by sum_{l in L(s), trained} 1 / |path_l| and scaled by G / K,
  summed and divided by the G rows, is the mean over the K trained leaf
  rows of A averaged along each path; V(s) still counts every leaf."""
  parent = np.array([-1, 0, 0, 1, 0, -1])  # the two-level tree above
  fork = np.array([0, 2, 5, 4, 6, 0])
  r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  lengths = np.array([8, 7, 6, 8, 7, 5])
  cols = np.arange(8)[None]
  mask = ((cols >= fork[:, None]) & (cols < lengths[:, None])).astype(int)
  ids = np.zeros(6, int)
  trained = np.array([False, True, False, True, False, True])
  plain = tree_credit.tree_advantages(r, parent, fork, mask, ids)
  sub = tree_credit.tree_advantages(
    r, parent, fork, mask, ids, path_lengths=lengths, trained=trained
  ) * (6 / 3)

  def owner(leaf, c):
    while fork[leaf] > c:
      leaf = parent[leaf]
    return leaf

  rows = [
    np.mean([plain[owner(leaf, c), c] for c in range(lengths[leaf])])
    for leaf in np.flatnonzero(trained)
  ]
  np.testing.assert_allclose(
    (sub * mask).sum() / 6, np.mean(rows), rtol=1e-5, atol=1e-6
  )
  # Row 0's first node [0, 2) lies on trained leaves 1 and 3 only; row 2
  # (leaf 2, untrained) and row 4 carry nothing.
  np.testing.assert_allclose(
    sub[0, :2], plain[0, :2] * 2 * (1 / 7 + 1 / 8), rtol=1e-6, atol=1e-6
  )
  assert not sub[2].any() and not sub[4].any()
  with pytest.raises(ValueError, match="path_lengths"):
    tree_credit.tree_advantages(r, parent, fork, mask, ids, trained=trained)


def test_select_leaves_keeps_one_correct_and_k_per_prompt():
  """The authors' select_terminal: K leaves a prompt, one of them correct
  whenever the prompt has a correct leaf; a prompt without one draws all K
  at random."""
  ids = np.repeat([0, 1, 2], 6)
  correct = np.zeros(18)
  correct[4] = 1  # prompt 0: one correct leaf, must be kept
  correct[[7, 9]] = 1  # prompt 1: two, at least one kept
  seen = np.zeros(18)
  for seed in range(200):
    keep = tree_credit.select_leaves(
      correct, ids, 3, np.random.default_rng(seed)
    )
    assert (np.bincount(ids[keep], minlength=3) == 3).all()
    assert keep[4] and keep[[7, 9]].any()
    seen += keep
  # The rest uniform: prompt 2's leaves 3/6 of the time each, prompt 0's
  # other leaves 2/5 (binomial sd over 200 draws: ~0.035).
  np.testing.assert_allclose(seen[12:] / 200, 0.5, rtol=0, atol=0.15)
  np.testing.assert_allclose(
    seen[[0, 1, 2, 3, 5]] / 200, 0.4, rtol=0, atol=0.15
  )
  with pytest.raises(ValueError, match="7 trained leaves"):
    tree_credit.select_leaves(correct, ids, 7, np.random.default_rng(0))
