"""rewards/confidence.py: ConfClip's confidence and reward, by hand."""

import numpy as np
import pytest

from rlreason.rewards import confidence


def test_confidence_is_geometric_mean_probability_over_mask():
  logp = np.log([[0.5, 0.25, 0.9], [0.8, 0.1, 0.1]])
  mask = np.array([[1, 1, 0], [1, 0, 0]])
  got = confidence.confidence(logp, mask)
  np.testing.assert_allclose(
    got, [np.sqrt(0.5 * 0.25), 0.8], rtol=1e-6, atol=1e-6
  )


def test_confidence_empty_mask_is_zero_and_shapes_checked():
  assert confidence.confidence(np.zeros((1, 2)), np.zeros((1, 2)))[0] == 0
  with pytest.raises(ValueError, match=r"\[N, T\]"):
    confidence.confidence(np.zeros((2, 3)), np.zeros((2, 2)))


def test_confclip_by_hand():
  correct = np.array([1, 1, 0, 0, 1])
  conf = np.array([0.5, 0.99, 0.5, 0.05, 0.0])
  r = confidence.confclip(
    correct, conf, weight=0.5, clip_low=0.2, clip_high=0.9
  )
  # c~ = [0.5, 0.9, 0.5, 0.2, 0.2]
  np.testing.assert_allclose(
    r, [1.25, 1.45, -0.25, -0.1, 1.1], rtol=1e-6, atol=1e-6
  )


def test_confclip_keeps_correct_above_wrong_and_spreads_solved_groups():
  rng = np.random.default_rng(0)
  conf = rng.uniform(size=64)
  correct = rng.integers(0, 2, size=64)
  r = confidence.confclip(correct, conf, weight=2.0, clip_low=0.1, clip_high=1)
  assert r[correct == 1].min() > r[correct == 0].max()
  # An all-correct group keeps a reward spread (0/1 rewards would not).
  solved = confidence.confclip(
    np.ones(4), [0.3, 0.5, 0.7, 0.8], weight=0.5, clip_low=0, clip_high=1
  )
  assert solved.std() > 0
  # weight 0 is the plain verifier reward.
  np.testing.assert_array_equal(
    confidence.confclip(correct, conf, weight=0, clip_low=0, clip_high=1),
    correct,
  )


def test_confclip_rejects_bad_constants():
  with pytest.raises(ValueError, match="clip_low"):
    confidence.confclip([1], [0.5], weight=1, clip_low=0.9, clip_high=0.2)
  with pytest.raises(ValueError, match="weight"):
    confidence.confclip([1], [0.5], weight=-1, clip_low=0, clip_high=1)
