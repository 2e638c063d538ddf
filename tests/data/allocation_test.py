"""Hand-computed tests of rlreason/data/allocation.py."""

import numpy as np
import pytest

from rlreason.data import allocation


def test_extra_groups_equal():
  acc = [0.0, 0.25, 1.0, 0.75]
  np.testing.assert_array_equal(allocation.extra_groups(acc, 3), [2, 1, 0, 0])
  np.testing.assert_array_equal(allocation.extra_groups(acc, 4), [2, 2, 0, 0])


def test_extra_groups_hardness():
  # Weights 1 and 0.5 -> shares 2 and 1 of 3.
  np.testing.assert_array_equal(
    allocation.extra_groups(
      [0.0, 0.5, 1.0], 3, threshold=0.6, schedule="hardness"
    ),
    [2, 1, 0],
  )


def test_extra_groups_no_hard_prompt_goes_to_the_lowest():
  np.testing.assert_array_equal(
    allocation.extra_groups([0.75, 1.0, 0.75], 2), [1, 0, 1]
  )
  assert allocation.extra_groups([0.0], 0).tolist() == [0]
  with pytest.raises(ValueError):
    allocation.extra_groups([0.0], 1, schedule="other")


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
