"""Blockwise (online-softmax) attention == dense attention: values, caches
and gradients; left padding, GQA, blocks that do not divide Q or S, a
prefill into a longer cache and a later block at a nonzero index."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import testing
from rlreason.model import attention
from rlreason.model import policy
from rlreason.model import transformer


def _case(n=2, nq=11, s=16, h=4, k=2, dh=8, index=0, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  q = jax.random.normal(keys[0], (n, nq, h, dh))
  kk = jax.random.normal(keys[1], (n, nq, k, dh))
  vv = jax.random.normal(keys[2], (n, nq, k, dh))
  k_cache = jax.random.normal(keys[3], (n, k, s, dh))
  v_cache = jax.random.normal(keys[4], (n, k, s, dh))
  slot_pos = jnp.where(jnp.arange(s)[None] < index + nq, jnp.arange(s), -1)
  slot_pos = jnp.broadcast_to(slot_pos, (n, s))
  slot_pos = slot_pos.at[0, :3].set(-1)  # row 0 left padded
  return q, kk, vv, k_cache, v_cache, slot_pos, jnp.asarray(index)


@pytest.mark.parametrize(
  "nq, s, index, block",
  [(11, 16, 0, 4), (11, 11, 0, 3), (5, 16, 6, 4), (16, 16, 0, 16)],
)
def test_blockwise_equals_dense(nq, s, index, block):
  args = _case(nq=nq, s=s, index=index)
  dense = attention.attend(*args, jnp.float32, impl="dense")
  blockwise = attention.attend(
    *args, jnp.float32, impl="blockwise", block=block
  )
  # Every query, padding ones included (a uniform softmax over the slots).
  np.testing.assert_allclose(blockwise[0], dense[0], rtol=1e-5, atol=1e-6)
  for a, b in zip(dense[1:], blockwise[1:]):  # caches written alike
    np.testing.assert_array_equal(a, b)


def test_blockwise_gradients_equal_dense():
  q, kk, vv, kc, vc, pos, index = _case(nq=12, s=12)
  weights = jax.random.normal(jax.random.key(9), (2, 12, 4, 8))

  def loss(q, kk, vv, impl):
    out, _, _ = attention.attend(
      q, kk, vv, kc, vc, pos, index, jnp.float32, impl=impl, block=5
    )
    return (out * weights).sum()

  g_dense = jax.grad(loss, argnums=(0, 1, 2))(q, kk, vv, "dense")
  g_block = jax.grad(loss, argnums=(0, 1, 2))(q, kk, vv, "blockwise")
  for a, b in zip(g_dense, g_block):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_the_model_scores_the_same_with_either_attention():
  cfg = testing.tiny_model_config()
  params = transformer.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, 20), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(20), tokens.shape)
  positions = positions.at[1, :4].set(-1)
  score = functools.partial(
    policy.completion_logprobs, params, tokens, positions, prompt_len=6
  )
  dense = score(
    model_cfg=cfg.__class__(**{**cfg.__dict__, "attention": "dense"})
  )
  block = score(
    model_cfg=cfg.__class__(
      **{**cfg.__dict__, "attention": "blockwise", "attention_block": 7}
    )
  )
  np.testing.assert_allclose(block, dense, rtol=1e-5, atol=1e-5)


def test_unknown_attention_is_an_error():
  with pytest.raises(ValueError, match="attention='flash'"):
    attention.attend(*_case(), jnp.float32, impl="flash")
