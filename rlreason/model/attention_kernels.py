"""The accelerator kernels behind attention.attend, each a drop-in for its
dense attention (same masking: a query sees its own slot and every earlier
real one; left padding by slot position < 0):

  splash  Pallas splash attention (TPU; interpret mode elsewhere: tests), a
          full forward;
  cudnn   jax.nn.dot_product_attention's cuDNN flash kernel (GPU), a full
          forward, rows permuted so real tokens come first (permute_rows);
  ragged  the Pallas GPU decode kernel, one query per row over that row's
          filled slots only (cache_slots sizes the samplers' caches for it).

Pallas kernels are not partitioned by XLA, so each runs per shard of the
activations' batch (and kv-head) split (_batch_shard_map). `platform` is
where attention compiles for (an abstract TPU slice when planning).

Shapes: N sequences, S slots, K kv heads, G query heads per kv head, Dh
head dim.
"""

import functools
import math

import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib

# ragged's cache length is a multiple of this (cache_slots).
RAGGED_SLOTS = 128


def platform() -> str:
  """The platform attention compiles for: the active mesh's devices (an
  abstract TPU slice when planning), else JAX's default backend."""
  mesh = mesh_lib.active_mesh()
  if mesh is not None:
    return mesh.devices.flat[0].platform
  return jax.default_backend()


# Splash's blocks are multiples of this; `splash` pads S up to one.
SPLASH_SLOTS = 128


def splash_block(s: int, block: int) -> int:
  """The largest of block, 512, 256, 128 dividing s (0: none does)."""
  for b in (block, 512, 256, 128):
    if b % 128 == 0 and s % b == 0:
      return b
  return 0


def _visible_rows(slot_pos):
  """[N, S] int32: 1 on real tokens (slot position >= 0), 0 on padding."""
  return (slot_pos >= 0).astype(jnp.int32)


def _batch_shard_map(fn, mesh, *arrays):
  """fn over the arrays split by rows (dim 0) over the mesh's batch axes
  and dim 1 over tensor where it divides (kv heads), as the activations
  are laid out: a Pallas kernel is not partitioned by XLA itself."""
  if mesh is None or mesh.size == 1:
    return fn(*arrays)
  rules = mesh_lib.ACTIVATION_RULES
  specs = tuple(
    mesh_lib.spec(
      ("batch",)
      + (("kv_heads",) if x.ndim > 2 else ())
      + (None,) * (x.ndim - (2 if x.ndim > 2 else 1)),
      rules,
      x.shape,
      mesh,
    )
    for x in arrays
  )
  return jax.shard_map(
    fn, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False
  )(*arrays)


@functools.lru_cache(maxsize=16)
def _splash_kernel(s: int, g: int, b: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 - TPU-only module, loaded on use
    splash_attention_kernel as sk,
    splash_attention_mask as sm,
  )

  mask = sm.MultiHeadMask([sm.CausalMask((s, s)) for _ in range(g)])
  sizes = sk.BlockSizes(
    block_q=b,
    block_kv=b,
    block_kv_compute=b,
    block_q_dkv=b,
    block_kv_dkv=b,
    block_kv_dkv_compute=b,
    block_q_dq=b,
    block_kv_dq=b,
  )
  # Its mask arrays are made eagerly: made inside the first caller's trace
  # they would be that trace's values, and the cached kernel would leak
  # them into the next trace at the same shapes.
  with jax.ensure_compile_time_eval():
    kernel = sk.make_splash_mqa(
      mask,
      head_shards=1,
      q_seq_shards=1,
      block_sizes=sizes,
      interpret=interpret,
    )
  return kernel, sk.SegmentIds


def splash(q, k_cache, v_cache, slot_pos, index, dt, block):
  """Splash attention: q [N, S, K, G, Dh] (Q == S, index 0); caches
  [N, K, S, Dh]. One MQA kernel per (row, kv head) over its G query heads;
  real tokens and padding are separate segments, so no query row is
  empty. S not a multiple of SPLASH_SLOTS is padded up to one with
  padding slots after the last (no real query sees them: they come after
  it) and the output cut back. Returns [N, S, K, G, Dh] in dt."""
  del index  # a full forward starts at slot 0
  n, s, k, g, dh = q.shape
  extra = -s % SPLASH_SLOTS
  if extra:
    pad = lambda x, axis, value=0: jnp.pad(  # noqa: E731
      x,
      [(0, extra if a == axis else 0) for a in range(x.ndim)],
      constant_values=value,
    )
    out = splash(
      pad(q, 1), pad(k_cache, 2), pad(v_cache, 2), pad(slot_pos, 1, -1),
      0, dt, block,
    )  # fmt: skip
    return out[:, :s]
  interpret = platform() != "tpu"
  kernel, segment_ids = _splash_kernel(s, g, splash_block(s, block), interpret)
  # The kernel does not scale the scores.
  qh = (q.astype(jnp.float32) / math.sqrt(dh)).astype(dt)
  qh = qh.transpose(0, 2, 3, 1, 4)  # [N, K, G, S, Dh]

  def rows(qh, kc, vc, seg):  # one shard's rows
    def row(qr, kr, vr, sr):  # [K, G, S, Dh], [K, S, Dh], [S]
      ids = segment_ids(q=sr, kv=sr)
      return jax.vmap(lambda a, b, c: kernel(a, b, c, segment_ids=ids))(
        qr, kr, vr
      )

    return jax.vmap(row)(qh, kc, vc, seg)

  out = _batch_shard_map(
    rows,
    mesh_lib.active_mesh(),
    qh,
    k_cache.astype(dt),
    v_cache.astype(dt),
    _visible_rows(slot_pos),
  )
  return out.transpose(0, 3, 1, 2, 4)  # [N, S, K, G, Dh]


def cudnn(q, k_cache, v_cache, slot_pos, index, dt, block, backend="cudnn"):
  """jax.nn.dot_product_attention (cuDNN flash on GPUs; `backend`="xla"
  runs the same masking with XLA, for tests). q [N, S, K, G, Dh] (Q == S);
  caches [N, K, S, Dh]. Rows are rolled so that their real tokens come
  first, then masked causally up to each row's count of real tokens.
  Returns [N, S, K, G, Dh] in dt."""
  del index, block
  n, s, k, g, dh = q.shape
  real = slot_pos >= 0  # [N, S]
  count = real.sum(-1).astype(jnp.int32)  # [N]
  # Slot order with the real tokens first (a stable sort keeps their order).
  order = jnp.argsort(~real, axis=-1, stable=True)  # [N, S]
  inverse = jnp.argsort(order, axis=-1)
  qs = permute_rows(q.reshape(n, s, k * g, dh), order, inverse).astype(dt)
  ks = permute_rows(k_cache.swapaxes(1, 2), order, inverse).astype(dt)
  vs = permute_rows(v_cache.swapaxes(1, 2), order, inverse).astype(dt)
  out = jax.nn.dot_product_attention(
    qs,
    ks,
    vs,
    is_causal=True,
    query_seq_lengths=count,
    key_value_seq_lengths=count,
    implementation=backend,
  )  # [N, S, H, Dh], rows in sorted order
  out = permute_rows(out, inverse, order)
  return out.reshape(n, s, k, g, dh).astype(dt)


def take_rows(x, order):
  """x [N, S, ...] with each row's S entries in `order` [N, S]."""
  return jnp.take_along_axis(
    x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1
  )


@jax.custom_vjp
def permute_rows(x, order, inverse):
  """take_rows(x, order), `inverse` the inverse permutation. Its gradient
  is the inverse gather, where autodiff's would be a scatter-add (three
  per layer in a GPU train step's backward: 115 ms of 2.36 s on an H100,
  bench.measured_vs_planned --profile_top)."""
  return take_rows(x, order)


def _permute_rows_fwd(x, order, inverse):
  return take_rows(x, order), (order, inverse)


def _permute_rows_bwd(res, g):
  order, inverse = res
  return take_rows(g, inverse), None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def cache_slots(length: int, decode: str) -> int:
  """The cache length a sampler allocates for `length` slots: rounded up
  to a multiple of RAGGED_SLOTS for the ragged decode kernel (the slots
  past `length` are never written nor read)."""
  if decode != "ragged":
    return length
  return -(-length // RAGGED_SLOTS) * RAGGED_SLOTS


def _ragged_blocks(s: int) -> tuple[int, int]:
  """(block_k, k_splits) of the decode kernel for a cache of s slots (a
  multiple of RAGGED_SLOTS): 64-slot blocks, the S axis split in up to 16
  parts run in parallel."""
  blocks = s // 64
  splits = max(d for d in range(1, 17) if blocks % d == 0)
  return 64, splits


def ragged(q, k_cache, v_cache, slot_pos, index, dt):
  """One query per row over its slots [first real slot, query slot] only:
  the Pallas decode kernel (jax.experimental.pallas.ops.gpu.decode_attention,
  Triton on GPUs, interpret mode elsewhere: tests) skips the cache blocks
  outside that span, where dense attention reads all S slots of every row
  (at 2.6 TB/s, 45% of an H100's decode step: bench.measured_vs_planned).
  Exact where a live row's real slots are one span (left padding, prompt,
  completion: the static and continuous samplers'; a finished row's
  padding slots are not, and its outputs go unread). q [N, 1, K, G, Dh];
  caches [N, K, S, Dh]; index [] or [N]. Returns [N, 1, K, G, Dh] in dt."""
  from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode  # noqa: PLC0415 - Pallas GPU module, loaded on use

  n, dh = q.shape[0], q.shape[-1]
  block, splits = _ragged_blocks(k_cache.shape[2])
  where = platform()
  if where == "tpu":
    raise ValueError(
      "decode attention 'ragged' is the GPU kernel; on TPU use dense"
    )
  end = jnp.broadcast_to(index + 1, (n,)).astype(jnp.int32)  # causal bound

  def rows(qr, kc, vc, pos, end):  # one shard: [n', K, G, Dh], ...
    start = jnp.argmax(pos >= 0, axis=-1).astype(jnp.int32)
    out = pallas_decode.gqa(
      qr.reshape(qr.shape[0], -1, dh),  # this shard's K x G heads
      kc.swapaxes(1, 2),  # the kernel's [N, S, K, Dh], swapped back inside
      vc.swapaxes(1, 2),
      start,
      end,
      sm_scale=1 / math.sqrt(dh),
      block_k=block,
      k_splits=splits,
      interpret=where != "gpu",
    )
    return out.reshape(qr.shape)

  out = _batch_shard_map(
    rows,
    mesh_lib.active_mesh(),
    q[:, 0].astype(dt),
    k_cache.astype(dt),
    v_cache.astype(dt),
    slot_pos,
    end,
  )
  # The kernel returns fp32 whatever its inputs: left so, the residual
  # stream after the first layer was fp32 and every later product of the
  # step an fp32 GEMM (the H100's ragged decode, session 29's HLO dump).
  return out[:, None].astype(dt)
