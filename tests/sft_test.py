"""Rejection sampling for expert iteration."""

import numpy as np

from rlreason import sft


def test_rejection_sampled_keeps_correct_distinct_samples_per_group():
  texts = ["a", "a", "b", "c", "a", "a", "x", "y"]
  correct = [1, 1, 1, 0, 1, 0, 0, 0]
  # Group 0 (a, a, b, c): first "a" and "b"; group 1 (a, a, x, y): first "a".
  np.testing.assert_array_equal(
    sft.rejection_sampled(correct, texts, 4), [1, 0, 1, 0, 1, 0, 0, 0]
  )
  np.testing.assert_array_equal(
    sft.rejection_sampled(correct, texts, 4, dedup=False),
    [1, 1, 1, 0, 1, 0, 0, 0],
  )
  # The same text in two groups is kept in each.
  np.testing.assert_array_equal(
    sft.rejection_sampled([1, 1], ["a", "a"], 1), [1, 1]
  )
