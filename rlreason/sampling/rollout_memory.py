"""How many sequences one sampler call holds in a device's memory.

  rows = rollout_memory.rows_per_call(model_cfg, P, T, free_bytes, shards)

A sequence being sampled holds its KV cache, the prefill's working set and
the decode step's buffers (sequence_bytes); a call may fill
ROLLOUT_FREE_FRACTION of the memory left free once the rollout parameters
are in place (the rest covers XLA temporaries the estimate leaves out).
Continuous batching holds more per slot (continuous_bytes: a second copy
of the cache, and the refill's prefilled cache).
rollout.generate sizes its calls (static batching) or its decode slots
(continuous batching) with `call_rows`; the planner (plan/rollout.py) with
`rows_per_call`.
"""

import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib
from rlreason.sampling import continuous
from rlreason.sampling import continuous_loop
from rlreason.model.transformer import ModelConfig

# A sampler call may fill this much of the memory left free on a device
# (the rest covers XLA's temporaries the per-sequence estimate leaves out).
ROLLOUT_FREE_FRACTION = 0.8


def _split(size: int, tensor: int) -> int:
  """A dimension's share per device over the mesh's `tensor` axis: split
  where it divides (mesh.spec), else whole."""
  return size // tensor if size % tensor == 0 else size


def sequence_bytes(
  model_cfg: ModelConfig, prompt_len: int, new_tokens: int, tensor: int = 1
):
  """Device bytes one sequence holds while it is sampled: its KV cache (all
  layers, P + T slots in the compute dtype) plus the prefill's working set
  (fp32 residual stream and MLP products of P tokens, one block of attention
  scores per head) and the decode step's [V] logits and [T] buffers; KV
  heads, MLP products, heads' scores and the logits' vocabulary split over
  a `tensor` axis of that size (mesh.ROLLOUT_RULES), the residual stream
  whole on each device."""
  c = model_cfg
  cache = cache_bytes(c, prompt_len + new_tokens, tensor)
  block = min(prompt_len, c.attention_block)
  prefill = 4 * prompt_len * (6 * c.d_model + 3 * _split(c.mlp_dim, tensor))
  prefill += 4 * 2 * _split(c.n_heads, tensor) * prompt_len * block
  decode = 4 * 4 * _split(c.vocab_size, tensor) + 4 * 4 * new_tokens
  return cache + prefill + decode


def cache_bytes(model_cfg: ModelConfig, length: int, tensor: int = 1) -> int:
  """One sequence's KV cache per device: all layers, `length` slots,
  compute dtype, its KV heads split over a `tensor` axis of that size."""
  c = model_cfg
  itemsize = jnp.dtype(c.compute_dtype).itemsize
  heads = _split(c.n_kv_heads, tensor)
  return 2 * c.n_layers * heads * c.head_dim * length * itemsize


def continuous_bytes(
  model_cfg, prompt_len, new_tokens, slots, shards, tensor: int = 1
):
  """Device bytes of continuous batching with `slots` decode slots split
  over `shards`: each slot's sequence_bytes and a second copy of its KV
  cache (the refill's scatter into the cache is not in place), plus the
  refill prefill's KV cache twice (its input and its output): the
  device's own refill rows where the slots and the refill rows split
  evenly over the shards (each row goes into a slot on its own device,
  continuous_loop._free_slots), else every refill row (gathered to every
  device). Checked by AOT compilation for Qwen3-8B (gspo), 2048 + 16384
  tokens on v5p-128: 640 slots, estimated at 58.96 GiB, compile to 54.9
  GiB per chip beside the parameters and resident arrays. (With the
  refill gathered to every chip, before refills wrote in place, and
  counted twice: 256 slots, 66.5 GiB in all, 12 GiB below the estimate;
  counted once: 448 slots, 89 GiB, 11 above.)"""
  per_shard = -(-slots // shards)
  refill = continuous.default_refill_rows(slots, shards)
  if continuous_loop.refill_in_place(slots, refill, shards):
    refill //= shards
  return per_shard * (
    sequence_bytes(model_cfg, prompt_len, new_tokens, tensor)
    + cache_bytes(model_cfg, prompt_len + new_tokens, tensor)
  ) + 2 * refill * cache_bytes(model_cfg, prompt_len, tensor)


def rows_per_call(
  model_cfg: ModelConfig,
  prompt_len: int,
  new_tokens: int,
  free_bytes: int,
  batch_shards: int = 1,
  batching: str = "static",
  tensor: int = 1,
) -> int:
  """Sequences one sampler call holds in `free_bytes` per device (a
  multiple of the batch shards; at least one per shard); with continuous
  batching, its decode slots (continuous_bytes); each sequence's share per
  device over a `tensor` axis of that size (sequence_bytes)."""
  budget = int(ROLLOUT_FREE_FRACTION * free_bytes)
  per_row = sequence_bytes(model_cfg, prompt_len, new_tokens, tensor)
  per_shard = max(1, budget // per_row)
  if batching == "continuous":  # the most slots that fit: bisection
    fits = lambda k: (
      k == 1
      or budget
      >= continuous_bytes(  # noqa: E731
        model_cfg,
        prompt_len,
        new_tokens,
        k * batch_shards,
        batch_shards,
        tensor,
      )
    )
    lo, hi = 1, per_shard  # fits(lo); continuous holds more than static
    while lo < hi:
      mid = (lo + hi + 1) // 2
      lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    per_shard = lo
  return per_shard * batch_shards


def call_rows(
  requested, n, model_cfg, p, t, mesh, params, batching="static"
) -> int:
  """Rows per sampler call (or decode slots): `requested` (> 0), else what
  the devices' free memory holds once `params` (the rollout copy) are in
  place (mesh given and its memory known), else all n.

  Raises:
    ValueError: `requested` is more than the free memory holds.
  """
  free = None
  if mesh is not None and mesh_lib.device_free_memory(mesh) is not None:
    jax.block_until_ready(params)  # their bytes count as in use
    free = mesh_lib.device_free_memory(mesh)
  if not free:
    return min(requested, n) if requested > 0 else n
  shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
  tensor = mesh.shape["tensor"]
  most = rows_per_call(model_cfg, p, t, free, shards, batching, tensor)
  if requested > most:
    raise ValueError(
      f"--rollout_rows={requested}: the devices' free memory "
      f"({free / 2**30:.2f} GiB per device) holds at most {most} sequences "
      f"of {p} + {t} tokens at once (rollout_memory.sequence_bytes). Lower "
      "it, or pass 0 to size the sampler calls from memory."
    )
  return min(requested if requested > 0 else most, n)
