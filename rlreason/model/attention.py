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
             other backends: tests), for a full forward (Q == S; S padded
             up to a multiple of 128 with padding slots after the last):
             causal mask + segment ids (real tokens vs padding);
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
splash, cudnn and the ragged decode kernel live in attention_kernels.py.
They agree to ~1e-6 in fp32 on the real tokens (tests/model/attention_test.py;
padding queries, whose outputs nothing reads, may differ).
"""

import math

import jax
import jax.numpy as jnp

from rlreason.model import attention_kernels as kernels
from rlreason.model.attention_kernels import platform

IMPLEMENTATIONS = ("auto", "dense", "blockwise", "splash", "cudnn")
# A one-token block's (decoding): see attend and kernels.ragged.
DECODE_IMPLEMENTATIONS = ("dense", "ragged")

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
  one to the block's (kernels.ragged; the samplers' layout, set by them),
  where the cache is whole blocks of kernels.RAGGED_SLOTS (cache_slots),
  else dense (a one-slot trace of the model's init, say).

  Returns the attention output [N, Q, H, Dh] and the updated caches.
  """
  n, nq, h, dh = q.shape
  k = kk.shape[2]
  # Write this block into the cache, then attend over every slot.
  k_cache = write_slots(k_cache, kk.swapaxes(1, 2), index, axis=2)
  v_cache = write_slots(v_cache, vv.swapaxes(1, 2), index, axis=2)
  s = k_cache.shape[2]
  q = q.reshape(n, nq, k, h // k, dh)  # [N, Q, K, H/K, Dh]
  if nq == 1 and decode == "ragged" and s % kernels.RAGGED_SLOTS == 0:
    out = kernels.ragged(q, k_cache, v_cache, slot_pos, index, dt)
    return out.reshape(n, nq, h, dh), k_cache, v_cache
  impl = resolve(impl, nq, s, block)
  if jnp.ndim(index) and impl in ("splash", "cudnn"):
    raise ValueError(f"attention={impl!r} needs one write index for all rows")
  if impl != "dense":
    kernel = {
      "blockwise": _blockwise,
      "splash": kernels.splash,
      "cudnn": kernels.cudnn,
    }[impl]
    out = kernel(q, k_cache, v_cache, slot_pos, index, dt, block)
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
  if impl != "auto":
    return impl
  if not (1 < nq and nq * s > block**2):
    return "dense"
  where = platform()
  if full and where == "tpu":
    return "splash"
  if full and where == "gpu":
    return "cudnn"
  return "blockwise"


def resolve_decode(decode: str, mesh=None) -> str:
  """The decode attention a sampler's --decode_attention means on `mesh`'s
  devices (else JAX's default backend's): "auto" is "ragged" on CUDA GPUs
  of compute capability >= 8.0 (Triton's Pallas kernel; on an H100 it
  decodes 1.31x faster than dense: README's measured_vs_planned row) and
  "dense" elsewhere (TPU, where the kernel does not run; CPU, where the
  kernel runs interpreted; older GPUs, unmeasured)."""
  if decode not in ("auto",) + DECODE_IMPLEMENTATIONS:
    raise ValueError(
      f"decode_attention={decode!r}; expected one of auto, "
      f"{', '.join(DECODE_IMPLEMENTATIONS)}"
    )
  if decode != "auto":
    return decode
  device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
  if device.platform != "gpu":
    return "dense"
  try:
    major = float(getattr(device, "compute_capability", "0") or 0)
  except ValueError:  # a ROCm name such as gfx90a
    return "dense"
  return "ragged" if major >= 8.0 else "dense"


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
