"""How many sequences one sampler call holds in a device's memory.

  rows = rollout_memory.rows_per_call(model_cfg, P, T, free_bytes, shards)

A sequence being sampled holds its KV cache, the prefill's working set and
the decode step's buffers (sequence_bytes); a call may fill
ROLLOUT_FREE_FRACTION of the memory left free once the rollout parameters
are in place (the rest covers XLA temporaries the estimate leaves out).
Continuous batching holds per slot a second copy of the cache and the
decode step's buffers, the prefill's working set only for the rows a
refill prefills, and a copy of the MLP weights (continuous_bytes,
calibrated on TPU compiles).
rollout.generate sizes its calls (static batching) or its decode slots
(continuous batching) with `call_rows`; the planner (plan/rollout.py) with
`rows_per_call`, and prints `call_bytes` (a call's estimate) beside each
compiled rollout. The estimate errs high (up to ESTIMATE_OVERCOUNT times
the compiled bytes), so a --rollout_rows above it that the planner's
compile fits is taken, with a warning, up to that factor.
"""

import jax
import jax.numpy as jnp
from absl import logging

from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason.sampling import continuous
from rlreason.sampling import continuous_loop
from rlreason.model.transformer import ModelConfig

# A sampler call may fill this much of the memory left free on a device
# (the rest covers XLA's temporaries the per-sequence estimate leaves out).
ROLLOUT_FREE_FRACTION = 0.8

# The most this estimate has overcounted a compiled sampler call's bytes
# (outputs + temporaries) in the planner's TPU compiles (this host's logs,
# sessions 50-52): 2.45 times for truncated_ppo's 32B static call at
# --rollout_tensor=8, 2.24-2.30 for rm_grpo's 7B static call at
# --mesh_tensor=4, 1.88-2.09 for continuous batching where each chip holds
# one KV head. --rollout_rows is refused only above the rows free memory
# would hold were the estimate this much too high (call_rows); between,
# the planner's compile (`python -m experiments.plan`, retry.more_rows)
# is the check.
ESTIMATE_OVERCOUNT = 2.5


def _split(size: int, tensor: int) -> int:
  """A dimension's share per device over the mesh's `tensor` axis: split
  where it divides (mesh.spec), else whole."""
  return size // tensor if size % tensor == 0 else size


def sequence_bytes(
  model_cfg: ModelConfig, prompt_len: int, new_tokens: int, tensor: int = 1
):
  """Device bytes one sequence holds while it is sampled in a static call
  (all rows prefilled at once): its KV cache (all layers, P + T slots in
  the compute dtype), the prefill's working set (prefill_bytes) and the
  decode step's buffers (decode_bytes); KV heads, MLP products, heads'
  scores and the logits' vocabulary split over a `tensor` axis of that
  size (mesh.ROLLOUT_RULES), the residual stream whole on each device."""
  return (
    cache_bytes(model_cfg, prompt_len + new_tokens, tensor)
    + prefill_bytes(model_cfg, prompt_len, tensor)
    + decode_bytes(model_cfg, new_tokens, tensor)
  )


def prefill_bytes(model_cfg: ModelConfig, prompt_len: int, tensor: int = 1):
  """One row's prefill working set per device: the fp32 residual stream
  and MLP products of its P tokens, one block of attention scores per
  head."""
  c = model_cfg
  block = min(prompt_len, c.attention_block)
  mlp = 4 * prompt_len * (6 * c.d_model + 3 * _split(c.mlp_dim, tensor))
  return mlp + 4 * 2 * _split(c.n_heads, tensor) * prompt_len * block


def decode_bytes(model_cfg: ModelConfig, new_tokens: int, tensor: int = 1):
  """One row's decode-step buffers per device: its [V] logits (fp32, a
  few copies) and [T] token buffers."""
  return 4 * 4 * _split(model_cfg.vocab_size, tensor) + 4 * 4 * new_tokens


def cache_bytes(model_cfg: ModelConfig, length: int, tensor: int = 1) -> int:
  """One sequence's KV cache per device: all layers, `length` slots,
  compute dtype, its KV heads split over a `tensor` axis of that size."""
  c = model_cfg
  itemsize = jnp.dtype(c.compute_dtype).itemsize
  heads = _split(c.n_kv_heads, tensor)
  return 2 * c.n_layers * heads * c.head_dim * length * itemsize


def mlp_copy_bytes(model_cfg: ModelConfig, tensor: int = 1) -> int:
  """A copy of every layer's MLP weights per device (compute dtype, split
  over a `tensor` axis of that size): the decode loop's temporaries that
  do not grow with its slots (continuous_bytes)."""
  c = model_cfg
  itemsize = jnp.dtype(c.compute_dtype).itemsize
  return 3 * c.d_model * _split(c.mlp_dim, tensor) * c.n_layers * itemsize


def continuous_bytes(
  model_cfg, prompt_len, new_tokens, slots, shards, tensor: int = 1
):
  """Device bytes of continuous batching with `slots` decode slots split
  over `shards`: per slot two copies of its KV cache (the refill's
  scatter into the cache is not in place) and the decode step's buffers;
  the refill's prefill working set and its prompts' KV cache twice (its
  input and its output) for the device's own refill rows where the slots
  and the refill rows split evenly over the shards (each row goes into a
  slot on its own device, continuous_loop._free_slots), else for every
  refill row (gathered to every device); and a copy of the MLP weights
  (mlp_copy_bytes), which the compiled decode loops hold whatever their
  slots.

  Calibrated on 39 TPU compiles of 7B and 32B presets (this host's
  planner logs, session 48: v6e, v4 and v5p, --mesh_tensor 1, 2 and 4,
  12 to 408 slots; estimate over the compiled rollout's outputs plus
  temporaries): 1.15 to 1.38 times the compiled bytes, except 0.88 for
  expert_iteration's 28 slots at --mesh_tensor=2 (ROLLOUT_FREE_FRACTION
  covers it), 1.77 for dapo's 32B with fsdp-split weights, and up to
  1.9 at --mesh_tensor=4 where each chip holds one KV head (its cache
  is written in place: one copy; 1.25 for grpo's shorter rows, whose
  bytes are mostly the weights' copy). The estimate before (each slot's whole
  prefill working set, no weight copy) was 0.54 to 2.8 times: over at
  many slots, under at few."""
  per_shard = -(-slots // shards)
  refill = continuous.default_refill_rows(slots, shards)
  if continuous_loop.refill_in_place(slots, refill, shards):
    refill //= shards
  slot = 2 * cache_bytes(
    model_cfg, prompt_len + new_tokens, tensor
  ) + decode_bytes(model_cfg, new_tokens, tensor)
  prompt = prefill_bytes(model_cfg, prompt_len, tensor) + 2 * cache_bytes(
    model_cfg, prompt_len, tensor
  )
  return per_shard * slot + refill * prompt + mlp_copy_bytes(model_cfg, tensor)


def call_bytes(
  model_cfg, prompt_len, new_tokens, rows, shards, batching="static", tensor=1
) -> int:
  """Device bytes of one sampler call of `rows` sequences split over
  `shards` (static batching: each device's rows times sequence_bytes) or
  of `rows` decode slots (continuous batching: continuous_bytes)."""
  if batching == "continuous":
    return continuous_bytes(
      model_cfg, prompt_len, new_tokens, rows, shards, tensor
    )
  per_row = sequence_bytes(model_cfg, prompt_len, new_tokens, tensor)
  return -(-rows // shards) * per_row


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
  if batching != "continuous":
    per_row = sequence_bytes(model_cfg, prompt_len, new_tokens, tensor)
    return max(1, budget // per_row) * batch_shards

  def fits(k):  # k slots per shard
    return k == 1 or budget >= call_bytes(
      model_cfg,
      prompt_len,
      new_tokens,
      k * batch_shards,
      batch_shards,
      batching,
      tensor,
    )

  # The most slots that fit, by bisection: fits(lo), and no more slots
  # than their caches alone would allow.
  slot = 2 * cache_bytes(model_cfg, prompt_len + new_tokens, tensor)
  lo, hi = 1, max(1, budget // slot)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
  return lo * batch_shards


def call_rows(
  requested, n, model_cfg, p, t, mesh, params, batching="static"
) -> int:
  """Rows per sampler call (or decode slots): `requested` (> 0), else what
  the devices' free memory holds once `params` (the rollout copy) are in
  place (mesh given and its memory known), else all n.

  A `requested` over what the estimate holds (rows_per_call) is taken with
  a warning while the free memory would hold it were the estimate
  ESTIMATE_OVERCOUNT times the compiled bytes (the planner's compiles say
  whether it fits).

  Raises:
    ValueError: `requested` is more than the free memory holds even then.
  """
  free = None
  if mesh is not None and devices.device_free_memory(mesh) is not None:
    jax.block_until_ready(params)  # their bytes count as in use
    free = devices.device_free_memory(mesh)
  if not free:
    return min(requested, n) if requested > 0 else n
  shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
  tensor = mesh.shape["tensor"]
  most = rows_per_call(model_cfg, p, t, free, shards, batching, tensor)
  if requested > most:
    how = "continuous" if batching == "continuous" else "sequence"
    estimate = (
      f"the devices' free memory ({free / 2**30:.2f} GiB per device) holds "
      f"{most} sequences of {p} + {t} tokens at once by the estimate "
      f"(rollout_memory.{how}_bytes)"
    )
    generous = rows_per_call(
      model_cfg,
      p,
      t,
      int(ESTIMATE_OVERCOUNT * free),
      shards,
      batching,
      tensor,
    )
    if requested > generous:
      raise ValueError(
        f"--rollout_rows={requested}: {estimate}, at most {generous} were "
        f"it {ESTIMATE_OVERCOUNT}x too high (the most it has overcounted a "
        "compile). Lower it, or pass 0 to size the sampler calls from "
        "memory."
      )
    logging.log_first_n(  # once a run: each RL step's rollout asks
      logging.WARNING,
      "--rollout_rows=%d: %s. Taken (up to %d: the estimate errs high); "
      "`python -m experiments.plan` compiles such a call for a TPU slice.",
      1,
      requested,
      estimate,
      generous,
    )
  return min(requested if requested > 0 else most, n)
