"""Blockwise (online-softmax) attention == dense attention: values, caches
and gradients; left padding, GQA, blocks that do not divide Q or S, a
prefill into a longer cache and a later block at a nonzero index."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import testing
from rlreason.model import attention
from rlreason.model import attention_kernels as kernels
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


@pytest.mark.parametrize(
  "impl, length, block",
  [("blockwise", 20, 7), ("splash", 128, 128), ("splash", 100, 128)],
)
def test_the_model_scores_the_same_with_either_attention(impl, length, block):
  cfg = testing.tiny_model_config()
  params = transformer.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, length), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
  positions = positions.at[1, :4].set(-1)
  score = functools.partial(
    policy.completion_logprobs, params, tokens, positions, prompt_len=6
  )
  dense = score(model_cfg=dataclasses.replace(cfg, attention="dense"))
  other = score(
    model_cfg=dataclasses.replace(cfg, attention=impl, attention_block=block)
  )
  np.testing.assert_allclose(other, dense, rtol=1e-5, atol=1e-5)


def test_unknown_attention_is_an_error():
  with pytest.raises(ValueError, match="attention=.flash."):
    attention.attend(*_case(), jnp.float32, impl="flash")


def _full_case(n=2, s=256, h=4, k=2, dh=16, seed=0):
  """A full forward (Q == S) with a left-padded row and a row whose last
  slots are padding (after a stop token)."""
  q, kk, vv, kc, vc, _, _ = _case(n=n, nq=s, s=s, h=h, k=k, dh=dh, seed=seed)
  pos = jnp.broadcast_to(jnp.arange(s), (n, s))
  pos = pos.at[0, :37].set(-1).at[1, s - 20 :].set(-1)
  return q, kk, vv, kc, vc, pos, jnp.asarray(0)


def _real(x, pos):
  """Outputs of the real queries only (padding queries' go unread)."""
  return np.asarray(x)[np.asarray(pos) >= 0]


@pytest.mark.parametrize(
  "impl, s", [("splash", 256), ("splash", 200), ("cudnn", 256)]
)
def test_kernels_equal_dense_on_real_tokens(impl, s, monkeypatch):
  """Splash (Pallas, interpret mode on CPU; S = 200 padded up to 256) and
  the cuDNN path's masking (run with XLA here: no GPU) == dense attention,
  values and gradients."""
  if impl == "cudnn":
    monkeypatch.setattr(
      kernels, "cudnn", functools.partial(kernels.cudnn, backend="xla")
    )
  q, kk, vv, kc, vc, pos, index = _full_case(s=s)
  weights = (
    jax.random.normal(jax.random.key(9), q.shape) * (pos >= 0)[:, :, None, None]
  )

  def run(q, kk, vv, impl):
    out, _, _ = attention.attend(
      q, kk, vv, kc, vc, pos, index, jnp.float32, impl=impl, block=128
    )
    return out

  dense, kernel = run(q, kk, vv, "dense"), run(q, kk, vv, impl)
  assert np.isfinite(np.asarray(kernel)).all()
  np.testing.assert_allclose(
    _real(kernel, pos), _real(dense, pos), rtol=1e-5, atol=1e-5
  )
  loss = lambda q, kk, vv, impl: (run(q, kk, vv, impl) * weights).sum()  # noqa: E731
  g_dense = jax.grad(loss, argnums=(0, 1, 2))(q, kk, vv, "dense")
  g_kernel = jax.grad(loss, argnums=(0, 1, 2))(q, kk, vv, impl)
  for a, b in zip(g_dense, g_kernel):
    assert np.isfinite(np.asarray(b)).all()
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_splash_on_a_mesh_equals_one_device():
  """Under an activation mesh the kernel runs per shard (rows over data x
  fsdp, kv heads over tensor) with the single-device values."""
  from rlreason import mesh as mesh_lib

  q, kk, vv, kc, vc, pos, index = _full_case(n=4)
  args = (q, kk, vv, kc, vc, pos, index, jnp.float32)
  one = attention.attend(*args, impl="splash", block=128)[0]
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)

  @jax.jit
  def sharded(*a):
    with mesh_lib.activation_mesh(mesh):
      return attention.attend(*a, jnp.float32, impl="splash", block=128)[0]

  out = sharded(*args[:-1])
  np.testing.assert_allclose(
    _real(out, pos), _real(one, pos), rtol=1e-5, atol=1e-6
  )


def test_splash_kernel_serves_a_second_trace():
  """The kernel is cached by shape: a second jit at the same shapes reuses
  it (its mask arrays made outside the first trace, not leaked from it)."""
  args = _full_case(s=128)[:-1]

  def attend(*a):
    return attention.attend(*a, jnp.asarray(0), jnp.float32, impl="splash")[0]

  first = jax.jit(attend)(*args)
  second = jax.jit(lambda *a: attend(*a) * 2.0)(*args)
  np.testing.assert_allclose(second, 2.0 * first, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
  "where, nq, s, expected",
  [
    ("tpu", 1024, 1024, "splash"),
    ("tpu", 1000, 1000, "splash"),  # padded up to a multiple of 128
    ("tpu", 512, 1535, "blockwise"),  # a prefill into a longer cache
    ("gpu", 1024, 1024, "cudnn"),
    ("cpu", 1024, 1024, "blockwise"),
    ("tpu", 1, 1024, "dense"),  # a decode step
    ("tpu", 64, 64, "dense"),  # short
  ],
)
def test_auto_picks_by_platform_and_shape(where, nq, s, expected, monkeypatch):
  monkeypatch.setattr(attention, "platform", lambda: where)
  assert attention.resolve("auto", nq, s, 128) == expected


@pytest.mark.parametrize(
  "impl, nq, s, match",
  [
    ("splash", 4, 16, "full forward"),
    ("cudnn", 4, 16, "full forward"),
  ],
)
def test_kernels_outside_their_shapes_are_errors(impl, nq, s, match):
  with pytest.raises(ValueError, match=match):
    attention.resolve(impl, nq, s, 128)


def test_permute_rows_backward_is_the_inverse_gather():
  """The cuDNN path's row permutation: autodiff's gradient exactly, with no
  scatter in the backward (a gather of the inverse permutation)."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((3, 10, 2, 4)), jnp.float32)
  order = jnp.asarray(np.stack([rng.permutation(10) for _ in range(3)]))
  inverse = jnp.argsort(order, axis=-1)
  w = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  mine = lambda x: (kernels.permute_rows(x, order, inverse) * w).sum()  # noqa: E731
  plain = lambda x: (kernels.take_rows(x, order) * w).sum()  # noqa: E731
  np.testing.assert_array_equal(jax.grad(mine)(x), jax.grad(plain)(x))
  prims = lambda f: {e.primitive.name for e in testing.jaxpr_eqns(f, x)}  # noqa: E731
  assert "scatter-add" in prims(jax.grad(plain))
  assert not {p for p in prims(jax.grad(mine)) if "scatter" in p}


def test_ragged_decode_needs_whole_blocks_of_cache_slots(monkeypatch):
  assert kernels.cache_slots(1535, "ragged") == 1536
  assert kernels.cache_slots(1535, "dense") == 1535
  assert kernels.cache_slots(128, "ragged") == 128
  # Other caches (the init's one-slot trace, say) decode densely.
  monkeypatch.setattr(kernels, "ragged", None)  # not called
  args = _case(n=2, nq=1, s=20, index=9)
  np.testing.assert_array_equal(
    attention.attend(*args, jnp.float32, decode="ragged")[0],
    attention.attend(*args, jnp.float32, decode="dense")[0],
  )
  with pytest.raises(ValueError, match="decode_attention='flash'"):
    dataclasses.replace(testing.tiny_model_config(), decode_attention="flash")


class _Device:
  def __init__(self, platform, compute_capability=None):
    self.platform = platform
    if compute_capability is not None:
      self.compute_capability = compute_capability


class _Mesh:
  def __init__(self, device):
    self.devices = np.asarray([device], dtype=object)


@pytest.mark.parametrize(
  "device, expected",
  [
    (_Device("gpu", "9.0"), "ragged"),  # H100: measured faster
    (_Device("gpu", "8.0"), "ragged"),
    (_Device("gpu", "7.5"), "dense"),  # T4: unmeasured
    (_Device("gpu", "gfx90a"), "dense"),  # ROCm
    (_Device("gpu"), "dense"),
    (_Device("tpu"), "dense"),  # the kernel is Triton's
    (_Device("cpu"), "dense"),  # the kernel would run interpreted
  ],
)
def test_auto_decode_attention_by_device(device, expected):
  assert attention.resolve_decode("auto", _Mesh(device)) == expected
  for named in attention.DECODE_IMPLEMENTATIONS:  # named: as named
    assert attention.resolve_decode(named, _Mesh(device)) == named


def test_auto_decode_attention_without_a_mesh_is_this_backends():
  expected = "dense" if jax.default_backend() != "gpu" else None
  got = attention.resolve_decode("auto")
  assert got == expected or (expected is None and got in ("dense", "ragged"))
  with pytest.raises(ValueError, match="decode_attention='flash'"):
    attention.resolve_decode("flash")


def test_multiturn_segments_refuse_ragged_decode():
  from rlreason.sampling import segments

  cfg = testing.tiny_model_config(decode_attention="ragged")
  with pytest.raises(ValueError, match="decode with dense attention"):
    segments.init_cache(cfg, 2, 128)


@pytest.mark.parametrize("per_row", [False, True], ids=["shared", "per_row"])
def test_ragged_decode_equals_dense(per_row):
  """One query per row over [first real slot, its slot]; with an index per
  row (continuous batching), slots past it keep stale positions."""
  q, kk, vv, kc, vc, pos, index = _case(n=3, nq=1, s=128, index=40)
  if per_row:
    index = jnp.asarray([40, 7, 90])
    pos = jnp.broadcast_to(jnp.arange(128), (3, 128)).at[0, :3].set(-1)
  args = (q, kk, vv, kc, vc, pos, index, jnp.float32)
  dense = attention.attend(*args, decode="dense")
  ragged = attention.attend(*args, decode="ragged")
  np.testing.assert_allclose(ragged[0], dense[0], rtol=1e-5, atol=1e-5)
  for a, b in zip(ragged[1:], dense[1:]):  # the same caches written
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("impl", ["dense", "blockwise", "splash", "cudnn"])
def test_full_forwards_keep_the_compute_dtype(impl, monkeypatch):
  """Every implementation returns the compute dtype (bf16 here), so the
  residual stream stays in it (test_ragged_decode_keeps_the_compute_dtype:
  the one that did not)."""
  monkeypatch.setattr(
    kernels, "cudnn", functools.partial(kernels.cudnn, backend="xla")
  )
  q, kk, vv, kc, vc, pos, index = _full_case()
  bf16 = [x.astype(jnp.bfloat16) for x in (q, kk, vv, kc, vc)]
  out = attention.attend(*bf16, pos, index, jnp.bfloat16, impl=impl, block=128)
  assert [x.dtype for x in out] == [jnp.bfloat16] * 3


def test_ragged_decode_keeps_the_compute_dtype():
  """bf16 in, bf16 out, as dense attention: the Pallas kernel's own output
  is fp32, which would carry the residual stream (and every later product
  of the decode step) to fp32."""
  q, kk, vv, kc, vc, pos, index = _case(n=2, nq=1, s=128, index=40)
  bf16 = [x.astype(jnp.bfloat16) for x in (q, kk, vv, kc, vc)]
  args = (*bf16, pos, index, jnp.bfloat16)
  dense = attention.attend(*args, decode="dense")
  ragged = attention.attend(*args, decode="ragged")
  assert dense[0].dtype == ragged[0].dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(ragged[0], np.float32),
    np.asarray(dense[0], np.float32),
    rtol=2e-2,
    atol=2e-2,
  )
