"""Tests for rlreason.rl.aggregation.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses


class AggregateTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    per_token = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 is empty
    expected = {
      "token-mean": 7 / 3,
      "token-sum": 7.0,
      "seq-mean-token-mean": (1.5 + 4) / 2,
      "seq-mean-token-sum": (3 + 4) / 2,
      "seq-mean-token-sum-norm": 7 / (2 * 3),
    }
    for mode, value in expected.items():
      fn = self.variant(functools.partial(aggregation.aggregate, mode=mode))
      np.testing.assert_allclose(
        fn(per_token, mask), value, rtol=1e-6, atol=1e-6
      )
    # Explicit normalisers override the local ones.
    fn = self.variant(
      functools.partial(
        aggregation.aggregate, mode="seq-mean-token-sum-norm", max_len=10
      )
    )
    np.testing.assert_allclose(
      fn(per_token, mask, num_seqs=4.0), 7 / 40, rtol=1e-6, atol=1e-7
    )
    fn = self.variant(
      functools.partial(aggregation.aggregate, mode="token-mean")
    )
    np.testing.assert_allclose(
      fn(per_token, mask, num_tokens=14.0), 0.5, rtol=1e-6, atol=1e-7
    )

  def test_modes_agree_on_uniform_masks(self):
    per_token = np.arange(12.0).reshape(3, 4) ** 0.5
    mask = np.ones((3, 4))
    token_mean = per_token.mean()
    for mode, scale in [
      ("token-mean", 1.0),
      ("seq-mean-token-mean", 1.0),
      ("seq-mean-token-sum-norm", 1.0),
      ("seq-mean-token-sum", 1 / 4),
      ("token-sum", 1 / 12),
    ]:
      np.testing.assert_allclose(
        aggregation.aggregate(per_token, mask, mode) * scale,
        token_mean,
        rtol=1e-6,
        atol=1e-6,
      )

  def test_dr_grpo_normaliser_does_not_depend_on_lengths(self):
    # Every valid token gets the same weight 1 / (num_seqs * max_len),
    # whatever the sequence lengths are.
    agg = functools.partial(
      aggregation.aggregate, mode="seq-mean-token-sum-norm", max_len=8
    )
    for mask in [
      np.array([[1, 1, 1, 1], [1, 0, 0, 0]]),
      np.array([[1, 1, 0, 0], [1, 1, 1, 0]]),
    ]:
      grad = jax.grad(agg)(np.zeros((2, 4)), mask)
      np.testing.assert_allclose(grad, mask / 16.0, rtol=1e-6, atol=1e-8)

  def test_empty_batch_and_unknown_mode(self):
    @jax.jit
    def values_and_grads(per_token, mask):
      return [
        jax.value_and_grad(aggregation.aggregate)(per_token, mask, mode)
        for mode in aggregation.AGGREGATION_MODES
      ]

    out = values_and_grads(np.full((2, 3), np.nan), np.zeros((2, 3)))
    for value, grad in out:  # exact: an empty mask selects zeros by a where
      self.assertEqual(float(value), 0.0)
      np.testing.assert_array_equal(grad, np.zeros((2, 3)))
    with self.assertRaisesRegex(ValueError, "valid modes.*token-mean"):
      aggregation.aggregate(np.zeros((1, 1)), np.ones((1, 1)), "mean")

  def test_other_masks_are_counted_and_passed_through(self):
    mask = np.array([[1, 1, 0], [0, 0, 0]], np.float32)
    value_mask = np.array([[1, 0, 0, 1], [1, 1, 1, 0]], np.float32)
    norm = aggregation.normalizers(mask, value_mask=value_mask)
    self.assertEqual(
      {k: float(v) for k, v in norm.items()},
      {"num_tokens": 2.0, "num_seqs": 1.0, "value_mask_tokens": 5.0},
    )
    per_token = np.array([[1.0, 3.0, 9.0], [5.0, 5.0, 5.0]], np.float32)
    # The extra count rides along in **norm; the mean stays 4 / 2.
    out = aggregation.aggregate(per_token, mask, "token-mean", **norm)
    np.testing.assert_allclose(out, 2.0, rtol=1e-6, atol=1e-6)
    with self.assertRaisesRegex(TypeError, "num_token"):
      aggregation.aggregate(per_token, mask, num_token=2.0)  # a typo


class SplitInvarianceTest(parameterized.TestCase):
  """Summing micro-batch losses (global normalisers) == full-batch loss."""

  def test_micro_batches_sum_to_full_batch(self):
    n, t, v, d = 8, 7, 5, 3
    rng = np.random.default_rng(0)
    # Uneven lengths; micro-batches are trimmed to their own longest row.
    lengths = np.array([7, 2, 5, 1, 3, 5, 4, 2])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    mask[3, 0] = 0.0  # row 3 is now empty
    mask[0, 2] = 0.0  # a multi-turn observation hole
    # numpy outside jit: every eager jnp op would be one more compilation.
    batch = (
      rng.normal(size=(n, t, d)).astype(np.float32),  # features
      rng.integers(0, v, size=(n, t)),  # tokens
      (rng.normal(size=(n, t)) * 0.3 - 1.5).astype(np.float32),  # old_logp
      (rng.normal(size=(n, t)) * 0.3 - 1.6).astype(np.float32),  # ref_logp
      rng.normal(size=(n,)).astype(np.float32),  # adv
      mask,
    )
    w = rng.normal(size=(d, v)).astype(np.float32)
    modes = aggregation.AGGREGATION_MODES

    def per_mode_losses(w, batch, norms):  # [len(modes)]
      feats, tokens, old_logp, ref_logp, adv, mask = batch
      logits = feats @ w  # [n, t, V]
      logp = jnp.take_along_axis(
        jax.nn.log_softmax(logits), tokens[..., None], axis=-1
      )[..., 0]
      pg, _ = losses.clipped_surrogate(
        logp, old_logp, adv, mask, clip_eps_high=0.28, dual_clip=3.0
      )
      # Every term uses the same mask and mode, and aggregate is linear.
      per_token = pg + 0.1 * kl.kl_k3(logp, ref_logp)
      return jnp.stack(
        [
          aggregation.aggregate(per_token, mask, mode, max_len=t, **norms)
          for mode in modes
        ]
      )

    # One compilation per micro-batch shape; every mode at once.
    @jax.jit
    def values_and_grads(w, batch, norms):
      fn = functools.partial(per_mode_losses, batch=batch, norms=norms)
      return fn(w), jax.jacrev(fn)(w)

    norms = jax.jit(aggregation.normalizers)(mask)  # of the WHOLE batch
    full_values, full_grads = values_and_grads(w, batch, norms)
    for num_micro in (1, 2, 4):
      values, grads = 0.0, 0.0
      for rows in np.split(np.arange(n), num_micro):
        t_micro = int(mask[rows].any(0).nonzero()[0].max()) + 1
        micro = tuple(
          x[rows][:, :t_micro] if x.ndim > 1 else x[rows] for x in batch
        )
        value, grad = values_and_grads(w, micro, norms)
        values, grads = values + np.asarray(value), grads + np.asarray(grad)
      for i, mode in enumerate(modes):
        msg = f"{mode}, {num_micro} micro-batches"
        np.testing.assert_allclose(
          values[i], full_values[i], rtol=1e-6, atol=1e-6, err_msg=msg
        )
        np.testing.assert_allclose(
          grads[i], full_grads[i], rtol=1e-6, atol=1e-6, err_msg=msg
        )


if __name__ == "__main__":
  absltest.main()
