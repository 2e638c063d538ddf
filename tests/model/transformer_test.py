"""Transformer invariants: cache == full forward, padding, dtypes, presets."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import blocks
from rlreason.model import policy
from rlreason import testing
from rlreason.model import presets
from rlreason.model import transformer

CFG = testing.tiny_model_config(
  vocab_size=50, qkv_bias=True, qk_norm=True, rope_scaling=(8.0, 1.0, 4.0, 16)
)


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0))


def _tokens(n, s, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(0, CFG.vocab_size, (n, s)), jnp.int32)


_apply = jax.jit(transformer.apply, static_argnums=3)


def test_incremental_cache_equals_full_forward(params):
  tokens = _tokens(3, 12)
  full = policy.logits(params, tokens, CFG)
  cache = transformer.init_cache(CFG, 3, 16)  # longer than needed
  pos = jnp.broadcast_to(jnp.arange(12), (3, 12))
  outs = []
  # A 5-token prefill, then 1, 2 and 4 tokens at a time.
  for lo, hi in [(0, 5), (5, 6), (6, 8), (8, 12)]:
    out, cache = _apply(params, tokens[:, lo:hi], pos[:, lo:hi], CFG, cache)
    outs.append(out)
  np.testing.assert_allclose(
    jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5
  )
  assert int(cache.index) == 12


def test_left_padding_equals_unpadded(params):
  """A left-padded row gives the same logits as the row alone."""
  tokens = _tokens(1, 7, seed=1)
  alone = policy.logits(params, tokens, CFG)
  padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), tokens], axis=1)
  mask = jnp.concatenate([jnp.zeros((1, 3)), jnp.ones((1, 7))], axis=1)
  out = policy.logits(
    params, padded, CFG, positions=policy.positions_from_mask(mask)
  )
  np.testing.assert_allclose(out[:, 3:], alone, rtol=1e-5, atol=1e-5)
  assert np.isfinite(np.asarray(out)).all()


def test_completion_logprobs_match_full_log_softmax(params):
  tokens = _tokens(2, 10, seed=2)
  pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
  logp, ent = policy.completion_logprobs(
    params, tokens, pos, CFG, 4, temperature=0.7, with_entropy=True
  )
  full = jax.nn.log_softmax(policy.logits(params, tokens, CFG) / 0.7, -1)
  want = jnp.take_along_axis(full[:, 3:-1], tokens[:, 4:, None], -1)[..., 0]
  np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)
  want_ent = -(jnp.exp(full) * full).sum(-1)[:, 3:-1]
  np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)


def test_bf16_compute_close_to_fp32(params):
  tokens = _tokens(2, 9)
  bf16 = CFG.__class__(**{**CFG.__dict__, "dtype": "bfloat16"})
  a = policy.logits(params, tokens, CFG)
  b = policy.logits(params, tokens, bf16)
  assert b.dtype == jnp.float32  # logits always come back in fp32
  assert float(jnp.abs(a - b).max()) < 0.05


def test_compute_params_score_as_the_master_weights(params):
  """Weights cast once to the compute dtype give the logits the fp32
  master weights give in that dtype (the model casts each weight before
  use); with `copy`, no leaf shares a buffer with the master weights (a
  train step donates those), without it leaves in the dtype are reused."""
  tokens = _tokens(2, 9)
  bf16 = CFG.__class__(**{**CFG.__dict__, "dtype": "bfloat16"})
  cast = transformer.compute_params(params, bf16)
  assert {x.dtype for x in jax.tree.leaves(cast)} == {jnp.dtype(jnp.bfloat16)}
  np.testing.assert_allclose(
    policy.logits(cast, tokens, bf16),
    policy.logits(params, tokens, bf16),
    rtol=0,
    atol=0,
  )
  ptr = lambda t: {x.unsafe_buffer_pointer() for x in jax.tree.leaves(t)}
  assert ptr(transformer.compute_params(params, CFG)) == ptr(params)
  copied = transformer.compute_params(params, CFG, copy=True)
  assert not ptr(copied) & ptr(params)
  for a, b in zip(jax.tree.leaves(copied), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def _dot_operand_dtypes(fn, *args):
  """The operand dtypes of every dot_general in fn's jaxpr (nested too)."""
  return [
    tuple(str(v.aval.dtype) for v in e.invars)
    for e in testing.jaxpr_eqns(fn, *args)
    if e.primitive.name == "dot_general"
  ]


def _unembed_grads(dot, dtype):
  rng = np.random.default_rng(3)
  h = jnp.asarray(rng.standard_normal((2, 3, 8)), dtype)
  w = jnp.asarray(rng.standard_normal((8, 11)), dtype)
  ct = jnp.asarray(rng.standard_normal((2, 3, 11)), jnp.float32)

  def loss(h, w):
    return (dot(h, w) * ct).sum()

  return jax.grad(loss, argnums=(0, 1)), (h, w)


def _plain_dot(h, w):
  return jnp.dot(h, w, preferred_element_type=jnp.float32)


def test_logits_dot_gradient_is_the_plain_products_in_fp32():
  grad, args = _unembed_grads(transformer.logits_dot, jnp.float32)
  want, _ = _unembed_grads(_plain_dot, jnp.float32)
  for a, b in zip(grad(*args), want(*args)):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_logits_dot_backward_stays_in_bf16():
  # The plain product's backward mixes the fp32 cotangent with bf16
  # operands: fp32 (TF32 on GPUs) products. logits_dot's takes bf16.
  grad, args = _unembed_grads(transformer.logits_dot, jnp.bfloat16)
  plain, _ = _unembed_grads(_plain_dot, jnp.bfloat16)
  assert any("float32" in d for d in _dot_operand_dtypes(plain, *args))
  dots = _dot_operand_dtypes(grad, *args)
  assert len(dots) == 3 and set(dots) == {("bfloat16", "bfloat16")}, dots
  exact, _ = _unembed_grads(_plain_dot, jnp.float32)  # fp32 products
  for a, b in zip(grad(*args), exact(*[x.astype(jnp.float32) for x in args])):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(
      np.asarray(a, np.float32), b, rtol=3e-2, atol=3e-2
    )


def _embed_grad(tokens, table, ct, dtype, lookup=blocks.embed):
  def loss(table):
    x = lookup(table, tokens, dtype)
    return (x.astype(jnp.float32) * ct).sum()

  return jax.grad(loss)(table)


def _take(table, tokens, dtype):
  return jnp.take(table, tokens, axis=0).astype(dtype)


@pytest.mark.parametrize(
  "length, chunk, chunks",
  [(14, 2048, 1), (14, 7, 2), (14, 4, 7), (14, 3, 7), (14, 1, 14), (13, 3, 1)],
)
def test_embedding_chunks(monkeypatch, length, chunk, chunks):
  # The fewest chunks of at most `chunk` that divide `length` (14 in chunks
  # of 4: 7 of 2), none when more than twice the fewest (13 is prime).
  monkeypatch.setattr(blocks, "EMBED_GRAD_CHUNK", chunk)
  assert blocks.embed_chunks(length) == chunks


@pytest.mark.parametrize("chunk", [1, 2, 3, 2048])
def test_embedding_gradient_by_hand(monkeypatch, chunk):
  # One row of six positions (token 0 three times): each table row's
  # gradient is the sum of its positions' cotangents, whatever the chunks
  # (six, three of 2 positions, two of 3, or one).
  monkeypatch.setattr(blocks, "EMBED_GRAD_CHUNK", chunk)
  tokens = jnp.array([[0, 2, 0, 1, 0, 2]])
  ct = jnp.array([[[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [1, 1]]])
  table = jnp.zeros((4, 2), jnp.float32)
  want = [[15, 18], [7, 8], [4, 5], [0, 0]]
  for dtype in (jnp.float32, jnp.bfloat16):
    grad = _embed_grad(tokens, table, ct.astype(jnp.float32), dtype)
    assert grad.dtype == jnp.float32
    np.testing.assert_allclose(grad, want, rtol=0, atol=0)


@pytest.mark.parametrize(
  "length, chunk", [(14, 3), (14, 7), (14, 2048), (13, 3)]
)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_gradient_is_autodiffs(monkeypatch, length, chunk, dtype):
  """Chunked (14 positions: seven chunks of 2, two of 7) or not (14 in
  one; 13, prime), the table's gradient is autodiff's of the plain
  lookup, accumulated in fp32 from the compute-dtype cotangent."""
  monkeypatch.setattr(blocks, "EMBED_GRAD_CHUNK", chunk)
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, 9, (3, length)), jnp.int32)
  table = jnp.asarray(rng.standard_normal((9, 6)), jnp.float32)
  ct = jnp.asarray(rng.standard_normal((3, length, 6)), dtype)
  got = _embed_grad(tokens, table, ct.astype(jnp.float32), dtype)
  want = _embed_grad(tokens, table, ct.astype(jnp.float32), dtype, _take)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(
    blocks.embed(table, tokens, dtype), _take(table, tokens, dtype)
  )


def test_embedding_looks_up_in_the_compute_dtype():
  # The table is cast before the gather (XLA fuses the two): on a mesh the
  # looked-up rows travel in bf16. The values are the plain lookup's
  # (test_embedding_gradient_is_autodiffs).
  tokens = jnp.zeros((3, 14), jnp.int32)
  table = jnp.zeros((9, 6), jnp.float32)
  for lookup, want in ((_take, "float32"), (blocks.embed, "bfloat16")):
    fn = functools.partial(lookup, dtype=jnp.bfloat16)
    (gather,) = [
      e
      for e in testing.jaxpr_eqns(fn, table, tokens)
      if e.primitive.name == "gather"
    ]
    assert str(gather.invars[0].aval.dtype) == want, lookup


def test_embedding_backward_converts_chunks_not_the_whole_cotangent(
  monkeypatch,
):
  # Autodiff converts the whole bf16 cotangent [3, 14, 6] to fp32 before
  # its scatter-add; the chunked backward converts one chunk, [3, 2, 6]
  # (seven chunks), at a time.
  monkeypatch.setattr(blocks, "EMBED_GRAD_CHUNK", 4)
  tokens = jnp.zeros((3, 14), jnp.int32)
  table = jnp.zeros((9, 6), jnp.float32)

  def converted(lookup):
    def loss(table):
      # (An element, not a sum: jnp.sum of bf16 converts it to fp32.)
      return lookup(table, tokens, jnp.bfloat16)[0, 0, 0]

    return {
      e.outvars[0].aval.shape
      for e in testing.jaxpr_eqns(jax.grad(loss), table)
      if e.primitive.name == "convert_element_type"
      and e.invars[0].aval.dtype == jnp.bfloat16
      and e.outvars[0].aval.dtype == jnp.float32
    }

  assert (3, 14, 6) in converted(_take)
  assert converted(blocks.embed) == {(3, 2, 6)}


@pytest.mark.parametrize("remat_policy", ["full", "dots", "offload"])
def test_remat_gives_same_gradients(params, remat_policy):
  """Each policy's gradients are those without remat (offload's host
  memory is the device's own on CPU: the same program otherwise)."""
  tokens = _tokens(2, 9)
  pos = jnp.broadcast_to(jnp.arange(9), (2, 9))

  def loss(p, cfg):
    return policy.completion_logprobs(p, tokens, pos, cfg, 3).sum()

  remat = dataclasses.replace(CFG, remat=True, remat_policy=remat_policy)
  g1 = jax.jit(jax.grad(functools.partial(loss, cfg=CFG)))(params)
  g2 = jax.jit(jax.grad(functools.partial(loss, cfg=remat)))(params)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), g1, g2
  )


def _scans(fn, *args) -> int:
  return sum(e.primitive.name == "scan" for e in testing.jaxpr_eqns(fn, *args))


@pytest.mark.parametrize("remat_policy", ["", "full", "dots", "offload"])
def test_scanned_layers_equal_the_unrolled_stack(params, remat_policy):
  """ModelConfig.scan_layers runs the layers as one lax.scan: the logits,
  every layer's cache and the gradients are the unrolled stack's, with
  and without remat; the parameter tree is unchanged."""
  unrolled = dataclasses.replace(
    CFG, remat=bool(remat_policy), remat_policy=remat_policy or "full"
  )
  scanned = dataclasses.replace(unrolled, scan_layers=True)
  assert jax.tree.structure(transformer.param_shapes(scanned)) == (
    jax.tree.structure(params)
  )
  tokens = _tokens(3, 9, seed=2)
  pos = jnp.broadcast_to(jnp.arange(9), (3, 9)) - jnp.array([[0], [2], [4]])
  want, want_cache = _apply(params, tokens, pos, unrolled)
  got, got_cache = _apply(params, tokens, pos, scanned)
  assert _scans(lambda p: _apply(p, tokens, pos, scanned), params) == 1
  assert _scans(lambda p: _apply(p, tokens, pos, unrolled), params) == 0
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert len(got_cache.k) == len(got_cache.v) == CFG.n_layers
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
    got_cache,
    want_cache,
  )

  def loss(p, cfg):
    return policy.completion_logprobs(p, tokens, pos, cfg, 3).sum()

  g1 = jax.jit(jax.grad(functools.partial(loss, cfg=unrolled)))(params)
  g2 = jax.jit(jax.grad(functools.partial(loss, cfg=scanned)))(params)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), g2, g1
  )


def test_cached_calls_stay_unrolled_under_scan_layers(params):
  """Only a full forward (no cache given) runs under the scan: a cached
  call (the sampler's prefill and decode steps) stays unrolled, its cache
  and weights not copied through a stack; the logits are the full
  forward's."""
  scanned = dataclasses.replace(CFG, scan_layers=True)
  tokens = _tokens(2, 8, seed=3)
  pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
  full = policy.logits(params, tokens, CFG)
  cache = transformer.init_cache(scanned, 2, 10)
  outs = []
  for lo, hi in [(0, 5), (5, 6), (6, 8)]:
    step = (tokens[:, lo:hi], pos[:, lo:hi], scanned, cache)
    assert _scans(lambda p, s=step: _apply(p, *s), params) == 0
    out, cache = _apply(params, *step)
    outs.append(out)
  np.testing.assert_allclose(
    jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5
  )


def test_scan_stacks_the_weights_in_the_compute_dtype(params):
  """The stacked copy holds what each layer reads: bf16 weights in a bf16
  run (the fp32 master weights are not copied whole)."""
  bf16 = dataclasses.replace(CFG, dtype="bfloat16", scan_layers=True)
  tokens = _tokens(2, 4)
  pos = jnp.broadcast_to(jnp.arange(4), (2, 4))
  (scan,) = [
    e
    for e in testing.jaxpr_eqns(
      lambda p: transformer.apply(p, tokens, pos, bf16), params
    )
    if e.primitive.name == "scan"
  ]
  stacked = [v.aval for v in scan.invars if v.aval.shape[:1] == (CFG.n_layers,)]
  kernels = [a for a in stacked if a.ndim >= 3 and a.shape[1] == CFG.d_model]
  assert kernels and all(a.dtype == jnp.bfloat16 for a in kernels), stacked


def test_param_axes_cover_every_param():
  axes = transformer.param_axes(CFG)
  shapes = transformer.param_shapes(CFG)
  pairs = jax.tree.map(
    lambda a, s: (a, s.shape),
    axes,
    shapes,
    is_leaf=lambda x: isinstance(x, tuple),
  )
  for a, shape in jax.tree.leaves(
    pairs,
    is_leaf=lambda x: (
      isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], tuple)
    ),
  ):
    assert len(a) == len(shape) and all(isinstance(n, str) for n in a)


def test_tiny_preset_size():
  n = presets.get("tiny").num_params()
  assert 100_000 < n < 1_000_000
  shapes = transformer.param_shapes(presets.get("tiny"))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == n


@pytest.mark.parametrize(
  "name,billions",
  [
    ("qwen2.5-math-1.5b", 1.54),
    ("qwen2.5-math-7b", 7.62),
    ("deepseek-r1-distill-qwen-1.5b", 1.78),
    ("qwen3-1.7b", 1.72),
    ("qwen3-8b", 8.19),
    ("llama-3.2-1b", 1.24),
    ("llama-3.1-8b", 8.03),
  ],
)
def test_real_presets_have_published_sizes(name, billions):
  shapes = transformer.param_shapes(presets.get(name))
  n = sum(x.size for x in jax.tree.leaves(shapes))
  assert abs(n / 1e9 - billions) / billions < 0.02, n


def test_unknown_preset_is_named():
  with pytest.raises(ValueError, match="Unknown model preset 'gpt-5'"):
    presets.get("gpt-5")
