"""Attention of the decoder: rotary embeddings and masked grouped-query
attention over the KV cache.

The parameters (q/k/v/o projections, q/k norms) live in the transformer's
Attention module; this file holds what it computes with them:

  q, k = apply_rope(q, pos, inv_freq), apply_rope(k, pos, inv_freq)
  out, k_cache, v_cache = attend(q, k, v, k_cache, v_cache, slot_pos, index, dt)

Shapes: N sequences, Q tokens in this call, S cache length, H / K query / kv
heads, Dh head dim.

Masking: a query sees its own slot and every earlier slot that holds a real
token (slot position >= 0); causality is by slot order, so left padding works.

Two implementations of the same function (`impl`):
  dense      [N, K, H/K, Q, S] scores and probabilities at once: fastest for
             decoding and short sequences;
  blockwise  online softmax (flash-attention's recurrence) over blocks of
             `block` queries x `block` keys in plain JAX, each query block
             rematerialised: activations O(S), never [.., Q, S]; the
             reference for the TPU / GPU kernels, and what CPUs run;
  splash     Pallas splash attention, the TPU kernel (interpret mode on
             other backends: tests), for a full forward (Q == S, a multiple
             of 128): causal mask + segment ids (real tokens vs padding);
  cudnn      jax.nn.dot_product_attention's cuDNN flash kernel (GPUs), for
             a full forward: each row is rolled so its real tokens come
             first (left padding -> right padding; attention depends only
             on their order), attended with causal + sequence-length masks,
             and rolled back;
  auto       for a block of several queries that would score more than
             block x block slots (Q > 1 and Q * S > block^2: training
             forwards and prefills): splash on TPU and cudnn on GPU where
             they apply, else blockwise; dense for decoding and short
             inputs. The platform is the active mesh's (so an AOT compile
             for a TPU slice on a CPU host picks splash), else JAX's
             default backend.
They agree to ~1e-6 in fp32 on the real tokens (tests/model/attention_test.py;
padding queries, whose outputs nothing reads, may differ).
"""

import functools
import math

import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib

IMPLEMENTATIONS = ("auto", "dense", "blockwise", "splash", "cudnn")
# A one-token block's (decoding): see attend and _ragged.
DECODE_IMPLEMENTATIONS = ("dense", "ragged")
# _ragged's cache length is a multiple of this (cache_slots).
RAGGED_SLOTS = 128

# Large finite negative, not -inf: a fully masked row (a padding query) then
# gives a uniform softmax instead of NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def rope_frequencies(model_cfg) -> jax.Array:
  """Inverse frequencies [Dh / 2], with llama3 scaling when configured.

  `model_cfg` is a transformer.ModelConfig (head_dim, rope_theta,
  rope_scaling). Llama 3.1 (HF `_compute_llama3_parameters`): wavelengths
  longer than original_max / low_freq_factor are divided by `factor`, shorter
  than original_max / high_freq_factor are kept, and the band between is
  interpolated smoothly.
  """
  dh = model_cfg.head_dim
  inv = 1.0 / (
    model_cfg.rope_theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh)
  )
  if model_cfg.rope_scaling is None:
    return inv
  factor, low, high, original = model_cfg.rope_scaling
  wavelen = 2 * math.pi / inv
  low_wavelen, high_wavelen = original / low, original / high
  scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
  smooth = (original / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(is_medium, smoothed, scaled)


def apply_rope(
  x: jax.Array, positions: jax.Array, inv_freq: jax.Array
) -> jax.Array:
  """Rotary embedding, HF "rotate_half" layout. x: [N, Q, H, Dh]."""
  angles = (
    positions[..., None].astype(jnp.float32) * inv_freq[None, None, :]
  )  # [N, Q, Dh/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  x32 = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def attend(
  q: jax.Array,
  kk: jax.Array,
  vv: jax.Array,
  k_cache: jax.Array,
  v_cache: jax.Array,
  slot_pos: jax.Array,
  index: jax.Array,
  dt,
  *,
  impl: str = "auto",
  block: int = 512,
  decode: str = "dense",
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Writes this block's keys and values into the cache, then attends.

  q [N, Q, H, Dh] and kk, vv [N, Q, K, Dh] (after rotary); k_cache, v_cache
  [N, K, S, Dh]; slot_pos [N, S] the position of each slot including this
  block (< 0 = empty or padding); index [] the block's first slot, or [N]
  one per row (continuous batching: each decode slot writes at its own
  column). Scores and softmax are fp32, the rest in the compute dtype `dt`.

  `decode` (DECODE_IMPLEMENTATIONS) is the attention of a one-token block:
  "dense" as above, or "ragged": only each row's slots from its first real
  one to the block's (_ragged; the samplers' layout, set by them), where
  the cache is whole blocks of RAGGED_SLOTS (cache_slots), else dense (a
  one-slot trace of the model's init, say).

  Returns the attention output [N, Q, H, Dh] and the updated caches.
  """
  n, nq, h, dh = q.shape
  k = kk.shape[2]
  # Write this block into the cache, then attend over every slot.
  k_cache = write_slots(k_cache, kk.swapaxes(1, 2), index, axis=2)
  v_cache = write_slots(v_cache, vv.swapaxes(1, 2), index, axis=2)
  s = k_cache.shape[2]
  q = q.reshape(n, nq, k, h // k, dh)  # [N, Q, K, H/K, Dh]
  if nq == 1 and decode == "ragged" and s % RAGGED_SLOTS == 0:
    out = _ragged(q, k_cache, v_cache, slot_pos, index, dt)
    return out.reshape(n, nq, h, dh), k_cache, v_cache
  impl = resolve(impl, nq, s, block)
  if jnp.ndim(index) and impl in ("splash", "cudnn"):
    raise ValueError(f"attention={impl!r} needs one write index for all rows")
  if impl != "dense":
    kernel = {"blockwise": _blockwise, "splash": _splash, "cudnn": _cudnn}
    out = kernel[impl](q, k_cache, v_cache, slot_pos, index, dt, block)
    return out.reshape(n, nq, h, dh), k_cache, v_cache
  scores = jnp.einsum(
    "nqkgd,nksd->nkgqs",
    q,
    k_cache.astype(dt),
    preferred_element_type=jnp.float32,
  )
  scores = scores / math.sqrt(dh)
  query_slot = _query_slots(index, nq)  # [Q] or [N, Q]
  visible = _causal(jnp.arange(s), query_slot) & (
    slot_pos[:, None, :] >= 0
  )  # [N, Q, S]
  scores = jnp.where(visible[:, None, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(dt)
  # This output order keeps both products plain batched matmuls over
  # (N, K); XLA:CPU falls back to a slow dot for the others.
  out = jnp.einsum("nkgqs,nksd->nkgqd", probs, v_cache.astype(dt))
  out = out.transpose(0, 3, 1, 2, 4).reshape(n, nq, h, dh)
  return out, k_cache, v_cache


def write_slots(buf, x, index, axis: int):
  """buf [N, ...] with x [N, ...] written from `index` along `axis`: one
  dynamic slice for a shared index [], one per row for an index [N]."""
  x = x.astype(buf.dtype)
  if not jnp.ndim(index):
    return jax.lax.dynamic_update_slice_in_dim(buf, x, index, axis=axis)
  return jax.vmap(
    lambda b, u, i: jax.lax.dynamic_update_slice_in_dim(b, u, i, axis - 1)
  )(buf, x, index)


def _query_slots(index, nq: int):
  """The slots of a block's Q queries: [Q], or [N, Q] for an index [N]."""
  if not jnp.ndim(index):
    return index + jnp.arange(nq)
  return index[:, None] + jnp.arange(nq)[None, :]


def _causal(slots, query_slot):
  """[N or 1, Q, S'] bool: slot s is at or before the query's slot.
  slots [S']; query_slot [Q] (one write index) or [N, Q] (one per row)."""
  if query_slot.ndim == 1:
    return (slots[None, :] <= query_slot[:, None])[None]
  return slots[None, None, :] <= query_slot[:, :, None]


def platform() -> str:
  """The platform attention compiles for: the active mesh's devices (an
  abstract TPU slice when planning), else JAX's default backend."""
  mesh = mesh_lib.active_mesh()
  if mesh is not None:
    return mesh.devices.flat[0].platform
  return jax.default_backend()


def _splash_block(s: int, block: int) -> int:
  """The largest of block, 512, 256, 128 dividing s (0: none does)."""
  for b in (block, 512, 256, 128):
    if b % 128 == 0 and s % b == 0:
      return b
  return 0


def resolve(impl: str, nq: int, s: int, block: int) -> str:
  """The implementation `impl` means for Q queries over S slots."""
  if impl not in IMPLEMENTATIONS:
    raise ValueError(
      f"attention={impl!r}; expected one of {', '.join(IMPLEMENTATIONS)}"
    )
  full = nq == s  # a whole sequence at once: training, scoring
  if impl in ("splash", "cudnn") and not full:
    raise ValueError(
      f"attention={impl!r} needs a full forward (Q == S); got Q={nq}, S={s}"
    )
  if impl == "splash" and not _splash_block(s, block):
    raise ValueError(f"attention='splash' needs S % 128 == 0; got S={s}")
  if impl != "auto":
    return impl
  if not (1 < nq and nq * s > block**2):
    return "dense"
  where = platform()
  if full and where == "tpu" and _splash_block(s, block):
    return "splash"
  if full and where == "gpu":
    return "cudnn"
  return "blockwise"


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
  kernel = sk.make_splash_mqa(
    mask,
    head_shards=1,
    q_seq_shards=1,
    block_sizes=sizes,
    interpret=interpret,
  )
  return kernel, sk.SegmentIds


def _splash(q, k_cache, v_cache, slot_pos, index, dt, block):
  """Splash attention: q [N, S, K, G, Dh] (Q == S, index 0); caches
  [N, K, S, Dh]. One MQA kernel per (row, kv head) over its G query heads;
  real tokens and padding are separate segments, so no query row is
  empty. Returns [N, S, K, G, Dh] in dt."""
  del index  # a full forward starts at slot 0
  n, s, k, g, dh = q.shape
  interpret = platform() != "tpu"
  kernel, segment_ids = _splash_kernel(s, g, _splash_block(s, block), interpret)
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


def _cudnn(q, k_cache, v_cache, slot_pos, index, dt, block, backend="cudnn"):
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


def _take_rows(x, order):
  """x [N, S, ...] with each row's S entries in `order` [N, S]."""
  return jnp.take_along_axis(
    x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1
  )


@jax.custom_vjp
def permute_rows(x, order, inverse):
  """_take_rows(x, order), `inverse` the inverse permutation. Its gradient
  is the inverse gather, where autodiff's would be a scatter-add (three
  per layer in a GPU train step's backward: 115 ms of 2.36 s on an H100,
  bench.measured_vs_planned --profile_top)."""
  return _take_rows(x, order)


def _permute_rows_fwd(x, order, inverse):
  return _take_rows(x, order), (order, inverse)


def _permute_rows_bwd(res, g):
  order, inverse = res
  return _take_rows(g, inverse), None, None


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


def _ragged(q, k_cache, v_cache, slot_pos, index, dt):
  """One query per row over its slots [first real slot, query slot] only:
  the Pallas decode kernel (jax.experimental.pallas.ops.gpu.decode_attention,
  Triton on GPUs, interpret mode elsewhere: tests) skips the cache blocks
  outside that span, where dense attention reads all S slots of every row
  (at 2.6 TB/s, 45% of an H100's decode step: bench.measured_vs_planned).
  Exact where a live row's real slots are one span (left padding, prompt,
  completion: the static and continuous samplers'; a finished row's
  padding slots are not, and its outputs go unread). q [N, 1, K, G, Dh];
  caches [N, K, S, Dh]; index [] or [N]. Returns [N, 1, K, G, Dh] in dt."""
  from jax.experimental.pallas.ops.gpu import decode_attention as kernels  # noqa: PLC0415 - Pallas GPU module, loaded on use

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
    out = kernels.gqa(
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
  return out[:, None]


def _blockwise(q, k_cache, v_cache, slot_pos, index, dt, block):
  """Online-softmax attention. q [N, Q, K, G, Dh]; caches [N, K, S, Dh];
  slot_pos [N, S]. Returns [N, Q, K, G, Dh] in dt."""
  n, nq, k, g, dh = q.shape
  s = k_cache.shape[2]
  bq, bk = min(block, nq), min(block, s)
  pad_q, pad_s = -nq % bq, -s % bk
  q = jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0), (0, 0)))
  kc = jnp.pad(k_cache, ((0, 0), (0, 0), (0, pad_s), (0, 0))).astype(dt)
  vc = jnp.pad(v_cache, ((0, 0), (0, 0), (0, pad_s), (0, 0))).astype(dt)
  pos = jnp.pad(slot_pos, ((0, 0), (0, pad_s)), constant_values=-1)
  cq, ck = (nq + pad_q) // bq, (s + pad_s) // bk
  qs = q.reshape(n, cq, bq, k, g, dh).swapaxes(0, 1)  # [Cq, N, bq, K, G, Dh]
  ks = kc.reshape(n, k, ck, bk, dh).transpose(2, 0, 1, 3, 4)  # [Ck, N, K..]
  vs = vc.reshape(n, k, ck, bk, dh).transpose(2, 0, 1, 3, 4)
  ps = pos.reshape(n, ck, bk).swapaxes(0, 1)  # [Ck, N, bk]
  scale = 1.0 / math.sqrt(dh)

  @jax.checkpoint  # the backward pass recomputes a query block's keys loop
  def query_block(_, xs):
    qi, qb = xs
    query_slot = _query_slots(index + qi * bq, bq)

    def key_block(carry, ys):
      m, l, acc = carry  # [N, K, G, bq], [N, K, G, bq], [.., bq, Dh]
      ki, kb, vb, pb = ys
      sc = jnp.einsum(
        "nqkgd,nksd->nkgqs", qb, kb, preferred_element_type=jnp.float32
      )
      sc = sc * scale
      slots = ki * bk + jnp.arange(bk)
      visible = _causal(slots, query_slot) & (pb[:, None, :] >= 0)
      sc = jnp.where(visible[:, None, None], sc, _MASK_VALUE)
      # Slots past S (block padding) do not exist: not even a fully masked
      # row's uniform softmax covers them. Block 0 always holds slot 0, so
      # m is finite before any all -inf block.
      sc = jnp.where((slots < s)[None, None, None, None], sc, -jnp.inf)
      m_new = jnp.maximum(m, sc.max(-1))
      p = jnp.exp(sc - m_new[..., None])
      corr = jnp.exp(m - m_new)
      l = l * corr + p.sum(-1)
      acc = acc * corr[..., None] + jnp.einsum(
        "nkgqs,nksd->nkgqd",
        p.astype(dt),
        vb,
        preferred_element_type=jnp.float32,
      )
      return (m_new, l, acc), None

    init = (
      jnp.full((n, k, g, bq), -jnp.inf, jnp.float32),
      jnp.zeros((n, k, g, bq), jnp.float32),
      jnp.zeros((n, k, g, bq, dh), jnp.float32),
    )
    (_, l, acc), _ = jax.lax.scan(key_block, init, (jnp.arange(ck), ks, vs, ps))
    return None, (acc / l[..., None]).astype(dt)  # [N, K, G, bq, Dh]

  _, out = jax.lax.scan(query_block, None, (jnp.arange(cq), qs))
  # [Cq, N, K, G, bq, Dh] -> [N, Q, K, G, Dh]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(n, cq * bq, k, g, dh)
  return out[:, :nq]
