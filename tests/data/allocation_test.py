"""Hand-computed tests of rlreason/data/allocation.py."""

import numpy as np
import pytest

from rlreason.data import allocation


def test_dars_extra_is_the_authors_table():
  acc = [0.0, 1 / 8, 2 / 8, 3 / 8, 4 / 8, 1.0]
  np.testing.assert_array_equal(
    allocation.dars_extra(acc, 8, "equal"), [24, 10, 3, 1, 0, 0]
  )
  np.testing.assert_array_equal(
    allocation.dars_extra(acc, 8, "hardness"), [40, 16, 4, 1, 0, 0]
  )
  # G = 4 halves them; 1/4 is in the <= 2/8 bucket.
  np.testing.assert_array_equal(
    allocation.dars_extra([0.0, 0.25], 4, "equal"), [12, 1.5]
  )
  with pytest.raises(ValueError, match="schedule='other'"):
    allocation.dars_extra([0.0], 8, "other")


def test_extra_rollouts_share_the_budget_by_the_table():
  acc = [0.0, 0.25, 1.0, 0.125]
  # Weights 24, 3, 0, 10 of 37: 12 * w / 37 = 7.78, 0.97, 0, 3.24.
  np.testing.assert_array_equal(
    allocation.extra_rollouts(acc, 12), [8, 1, 0, 3]
  )
  # HW: weights 40, 4, 0, 16 of 60: 6 * w / 60 = 4, 0.4, 0, 1.6.
  np.testing.assert_array_equal(
    allocation.extra_rollouts(acc, 6, schedule="hardness"), [4, 0, 0, 2]
  )
  # The threshold cuts: below 0.2 only.
  np.testing.assert_array_equal(
    allocation.extra_rollouts(acc, 34, threshold=0.2), [24, 0, 0, 10]
  )


def test_extra_rollouts_without_a_hard_prompt_go_to_the_lowest():
  np.testing.assert_array_equal(
    allocation.extra_rollouts([0.75, 1.0, 0.75], 2), [1, 0, 1]
  )
  assert allocation.extra_rollouts([0.0], 0).tolist() == [0]
  with pytest.raises(ValueError):
    allocation.extra_rollouts([0.0], 1, schedule="other")


def test_pooled_advantages():
  # Key a: rewards 1, 0, 0, 1 -> mean 0.5, std (ddof 1) = sqrt(1/3).
  r = [1.0, 0.0, 0.0, 1.0, 5.0]
  keys = ["a", "a", "a", "a", "b"]
  adv = allocation.pooled_advantages(r, keys, eps=0.0)
  s = np.sqrt(1 / 3)
  np.testing.assert_allclose(
    adv, [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0], rtol=1e-6, atol=1e-6
  )
  # All-equal pool -> 0, not NaN (exactly: x - x is 0).
  np.testing.assert_array_equal(
    allocation.pooled_advantages([1.0, 1.0], ["a", "a"]), [0, 0]
  )


def test_pooled_advantages_without_std():
  # Key a: mean 0.25; key b: mean 0.5 over its 2 samples.
  adv = allocation.pooled_advantages(
    [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], list("aaaabb"), scale=False
  )
  np.testing.assert_allclose(
    adv, [0.75, -0.25, -0.25, -0.25, 0.5, -0.5], rtol=1e-6, atol=1e-6
  )
  # Cumulative advantage of a 0/1 pool: 2 n p (1 - p) = 2 * 4 * 3 / 16.
  assert np.abs(adv[:4]).sum() == pytest.approx(1.5, rel=1e-6, abs=1e-6)


def test_repeat_for():
  assert allocation.repeat_for(["x", "y", "z"], [2, 0, 1]) == ["x", "x", "z"]
