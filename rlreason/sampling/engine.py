"""What the static and the continuous samplers (sampler.py, continuous.py)
and the tree sampler share: argument checks before anything compiles, the
rollout layout's sharding constraints on activations and the KV cache,
weights cast to the compute dtype once per call, a forward to the last
token's logits, and jit with compiler options.

Shapes as in sampler.py.
"""

from collections.abc import Callable

import jax
import numpy as np

from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason.model import transformer
from rlreason.sampling import stops
from rlreason.sampling.draw import Sampling

# Decode steps between a sampler's progress reports (sampler.py: from
# inside its loop; continuous.py: host calls of that many steps): seconds
# of a paper-scale rollout, whose decode step takes tens of ms; each report
# is one scalar to the host. Fixed, not timed: every process of a
# multi-host run must split a loop alike.
PROGRESS_STEPS = 256
# The progress callbacks of the sampler calls under way, innermost last
# (`reporting`); the compiled loops call the last through `report`.
_PROGRESS: list[Callable[[int], None]] = []


def check_inputs(
  tokens,
  positions,
  model_cfg,
  max_new_tokens,
  sampling,
  stop_ids,
  stop_sequences,
  pad_id,
  row_limits=None,
):
  """Raises ValueError on bad arguments, before anything is compiled;
  returns the stops as stops.split gives them."""
  stop_ids, stop_sequences = stops.split(stop_ids, stop_sequences)
  if not isinstance(sampling, Sampling):
    raise TypeError(
      f"sampling must be a sampling.Sampling, got {type(sampling).__name__}"
    )
  if tokens.ndim != 2 or tokens.shape != positions.shape:
    raise ValueError(
      f"tokens {tokens.shape} and positions {positions.shape} "
      "must both be [N, P]"
    )
  if tokens.shape[0] == 0 or tokens.shape[1] == 0:
    raise ValueError(f"Empty prompt batch: tokens have shape {tokens.shape}")
  if not (
    isinstance(max_new_tokens, (int, np.integer)) and max_new_tokens >= 1
  ):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  v = model_cfg.vocab_size
  stops.check_vocab(stop_ids, stop_sequences, v)
  if not 0 <= pad_id < v:
    raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {v})")
  if row_limits is not None:
    if np.shape(row_limits) != tokens.shape[:1]:
      raise ValueError(
        f"row_limits {np.shape(row_limits)} must be [N] = {tokens.shape[:1]}"
      )
    if isinstance(row_limits, np.ndarray) and (
      (row_limits < 1).any() or (row_limits > max_new_tokens).any()
    ):
      raise ValueError(
        f"row_limits must be in [1, max_new_tokens={max_new_tokens}]; got "
        f"{row_limits.min()}..{row_limits.max()}"
      )
  if isinstance(positions, np.ndarray) and (positions[:, -1] < 0).any():
    rows = np.flatnonzero(positions[:, -1] < 0)[:5].tolist()
    raise ValueError(
      f"Rows {rows} end with padding: prompts must be left padded and non-empty"
    )
  return stop_ids, stop_sequences


# Logical axes of a cache k / v buffer (the model's layout).
_KV_AXES = transformer.CACHE_AXES


def constrain(x: jax.Array, axes: tuple, mesh) -> jax.Array:
  """x constrained to its logical `axes` under mesh.ROLLOUT_RULES (a no-op
  without a mesh; indivisible dimensions stay replicated)."""
  if mesh is None:
    return x
  spec = mesh_lib.spec(axes, mesh_lib.ROLLOUT_RULES, x.shape, mesh)
  return jax.lax.with_sharding_constraint(
    x, jax.sharding.NamedSharding(mesh, spec)
  )


def constrain_cache(cache: transformer.Cache, mesh) -> transformer.Cache:
  """The cache's k / v / pos constrained to the rollout batch sharding."""
  if mesh is None:
    return cache
  return transformer.Cache(
    k=tuple(constrain(k, _KV_AXES, mesh) for k in cache.k),
    v=tuple(constrain(v, _KV_AXES, mesh) for v in cache.v),
    pos=constrain(cache.pos, ("batch", "seq"), mesh),
    index=cache.index,
  )


def last_logits(params, tokens, positions, cache, model_cfg, mesh):
  """tokens, positions [N, Q] through the model with `cache` -> the last
  token's logits [N, V] fp32 and the cache, both in the rollout batch
  sharding on `mesh` (activations split by batch)."""
  with mesh_lib.activation_mesh(mesh):
    hidden, cache = transformer.hidden_states(
      params, tokens, positions, model_cfg, cache
    )
  logits = transformer.unembed(params, hidden[:, -1], model_cfg)
  return batch_logits(logits, mesh), constrain_cache(cache, mesh)


def batch_logits(logits: jax.Array, mesh) -> jax.Array:
  """A decode step's logits [N, V] in the rollout batch sharding, first
  split by vocab as the unembedding is (over tensor): each device's
  [N, V / tensor] from its own shard, then gathered, not the [D, V]
  weights gathered every decode step (1 GiB at a 7B vocab with
  --mesh_tensor=2: the planner's ICI bytes showed it)."""
  logits = constrain(logits, ("batch", "vocab"), mesh)
  return constrain(logits, ("batch", None), mesh)


def jitted(fn, compiler_options: dict | None, **spec):
  """`fn` = jax.jit(body, **spec) as is, or with `compiler_options` the
  same body jitted again with them (cached: calls with the same options
  and shapes never recompile)."""
  if not compiler_options:
    return fn
  return devices.jit_with_options(fn.__wrapped__, compiler_options, **spec)


def progress_every(progress: Callable[[int], None] | None) -> int:
  """A loop's static `progress_every`: PROGRESS_STEPS given a callback, 0
  (no reports compiled in) without one, and on GPUs: there XLA runs a
  lax.cond by reading its predicate back to the host, which every decode
  step would then do (not measured: no GPU was lent)."""
  if progress is None or jax.default_backend() == "gpu":
    return 0
  return PROGRESS_STEPS


def report(every: int, before, after, more, done) -> None:
  """Inside a jitted loop: the running call's progress (`reporting`) gets
  `done` where the decode steps went from `before` to past a multiple of
  `every` and `more` work is left. A jax.debug.callback: one scalar to the
  host of the mesh's first device (process 0's), nothing for every=0. JAX's
  persistent compilation cache keeps no program with one, so a rerun
  compiles such a loop again."""
  if every:
    due = (after // every > before // every) & more
    jax.lax.cond(
      due, lambda d: jax.debug.callback(_report, d), lambda d: None, done
    )


def _report(done) -> None:
  if _PROGRESS:
    _PROGRESS[-1](int(done))


def reporting(progress: Callable[[int], None] | None, call: Callable):
  """call() with `progress` as the reports' callback; with one, waits for
  the outputs, so that its reports have all come before it is unset."""
  if progress is None:
    return call()
  _PROGRESS.append(progress)
  try:
    return jax.block_until_ready(call())
  finally:
    _PROGRESS.pop()
