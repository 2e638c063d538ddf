"""The rollout program for the planner: the sampler as the loop calls it.

  rows = rollout.rows_for(cfg, model_cfg, mesh, hbm_bytes, resident)
  prog = rollout.compile_rollout(cfg, model_cfg, mesh, rows, hbm_bytes)

Static batching (sampler._sample over one call's rows), continuous batching
(continuous_loop.run: every row through the call's decode slots) or a tree
call (tree_loop: whole prompts' trees, one round), over abstract parameters
laid out as mesh.rollout_rules chooses (plan/state.py), on the sampler's
own mesh where --rollout_tensor gives it one (mesh.rollout_mesh). plan/aot.py
compiles it beside the run's other programs.
"""

import dataclasses

import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib
from rlreason.model import lora
from rlreason.plan import program as program_lib
from rlreason.plan import state as state_lib
from rlreason.sampling import continuous
from rlreason.sampling import continuous_loop
from rlreason.sampling import draw
from rlreason.sampling import engine
from rlreason.sampling import rollout_layout
from rlreason.sampling import rollout_memory
from rlreason.sampling import sampler
from rlreason.sampling import segments
from rlreason.sampling import tree_loop
from rlreason.train import adapters as adapters_lib
from rlreason.train import train_step as ts


def rows_for(
  cfg, model_cfg, mesh, hbm_bytes, resident: int, overcount: float = 1.0
) -> int:
  """Sequences per sampler call the loop would use on this slice: what
  the HBM left beside the resident arrays and the rollout parameters
  holds (rollout_memory.rows_per_call), at most N; with `overcount`
  (rollout_memory.ESTIMATE_OVERCOUNT), the most --rollout_rows the run
  takes (call_rows: that memory were the estimate so many times too
  high). A tree rollout's call holds whole prompts' trees
  (tree_loop.call_shape), sized as tree_loop sizes it."""
  n, t = cfg.num_sequences, cfg.max_new_tokens
  tree_shape = tree_loop.call_shape(cfg)
  if tree_shape:
    per_prompt, slots, _ = tree_shape
    n = n // cfg.group_size * per_prompt
    t = slots - cfg.max_prompt_len
  if not hbm_bytes:
    return n
  sampled = rollout_layout.sampled_as(cfg, model_cfg, mesh)
  mesh = rollout_layout.sampling_mesh(mesh, sampled)
  params = state_lib.per_device_bytes(
    state_lib.rollout_params(sampled, mesh, hbm_bytes)
  )
  free = int(overcount * max(hbm_bytes - resident - params, 0))
  shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
  rows = rollout_memory.rows_per_call(
    model_cfg,
    cfg.max_prompt_len,
    t,
    free,
    shards,
    "static" if tree_shape else getattr(cfg, "rollout_batching", "static"),
    mesh.shape["tensor"],
  )
  return min(n, rows)


def _estimate(cfg, model_cfg, mesh, rows: int) -> int:
  """Per-device bytes of `rows` sequences per sampler call as the run
  sizes its calls (rollout_memory; continuous batching's slots where
  they are fewer than the N rows, as compile_rollout compiles them)."""
  p, t = cfg.max_prompt_len, cfg.max_new_tokens
  shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
  tensor = mesh.shape["tensor"]
  continuous = getattr(cfg, "rollout_batching", "static") == "continuous"
  batching = (
    "continuous" if continuous and rows < cfg.num_sequences else "static"
  )
  return rollout_memory.call_bytes(
    model_cfg, p, t, rows, shards, batching, tensor
  )


def _tree_round(params, tokens, positions, rng, *, slots, **kw):
  """A tree call's rows in one cache of `slots` slots per row: their
  prompts written, one segment decoded (segments.decode, dense attention
  over every slot), the cache kept for the rounds after it."""
  model_cfg, mesh = kw["model_cfg"], kw["mesh"]
  n = tokens.shape[0]
  cache = segments.init_cache(model_cfg, n, slots, mesh=mesh)
  logits, cache = segments.extend(
    params, cache, tokens, positions, model_cfg=model_cfg, mesh=mesh
  )
  start = positions[:, -1] + 1
  return segments.decode(
    params, cache, logits, start, jnp.ones(n, bool), rng, **kw
  )


def compile_rollout(
  cfg, model_cfg, mesh, rows, hbm_bytes=None
) -> program_lib.Program:
  model_cfg = rollout_layout.sampled_as(cfg, model_cfg, mesh)
  # The train state's mesh (LoRA's base and adapters sample where they
  # are) and the sampler's (--rollout_tensor: rollout_layout.sampling_mesh).
  train_mesh, mesh = mesh, rollout_layout.sampling_mesh(mesh, model_cfg)
  params = state_lib.rollout_params(model_cfg, mesh, hbm_bytes)
  frozen = state_lib.lora_base(cfg, model_cfg, train_mesh)
  if frozen is not None and cfg.lora_quantize:
    # QLoRA samples base + adapters unmerged (train/adapters.py).
    adapters, axes, _ = state_lib.trained_shapes(cfg, model_cfg)
    adapters = state_lib.abstract(
      adapters,
      mesh_lib.shardings(train_mesh, axes, mesh_lib.TRAIN_RULES, adapters),
    )
    shapes_only = dataclasses.replace(  # scale 1: abstract arrays pass
      adapters_lib.lora_config(cfg), alpha=float(cfg.lora_rank)
    )
    params = lora.combine(frozen[0], adapters, shapes_only)
  sh = mesh_lib.batch_sharding(mesh, 2, mesh_lib.ROLLOUT_RULES)
  n, p = cfg.num_sequences, cfg.max_prompt_len
  budget = getattr(cfg, "rollout_temp_budget_mib", 0)
  options = ts.compiler_options(budget, mesh)  # the loop's (Context.generate)
  common = dict(
    model_cfg=model_cfg,
    max_new_tokens=cfg.max_new_tokens,
    sampling=draw.Sampling(temperature=cfg.temperature),
    stop_ids=(0,),
    pad_id=0,
    mesh=mesh,
  )
  refills = 0  # continuous batching's, per call
  tree_shape = tree_loop.call_shape(cfg)
  if tree_shape:
    # A call's whole trees in caches of P + (1 + L) T slots (tree.generate;
    # dense decode attention, no temporaries budget: its jitted pieces
    # compile without one). The rows decode in rounds; here all at once:
    # the caches they hold, and each round's decode.
    per_prompt, slots, _ = tree_shape
    shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
    prompts = tree_loop.call_prompts(rows, per_prompt, shards)
    rows = min(prompts, n // cfg.group_size) * per_prompt
    # Split by rows where they divide, else replicated (mesh.put_rows).
    split = mesh_lib.spec(
      ("batch", None), mesh_lib.ROLLOUT_RULES, (rows, p), mesh
    )
    ids = jax.ShapeDtypeStruct(
      (rows, p), jnp.int32, sharding=jax.sharding.NamedSharding(mesh, split)
    )
    dense = dataclasses.replace(model_cfg, decode_attention="dense")
    lowered = jax.jit(
      _tree_round, static_argnames=(*common, "slots")
    ).lower(
      params, ids, ids, jax.random.key(0), slots=slots,
      **{**common, "model_cfg": dense},
    )  # fmt: skip
    options = {}
  elif getattr(cfg, "rollout_batching", "static") == "continuous" and rows < n:
    # All N rows through `rows` decode slots (rollout.generate).
    ids = jax.ShapeDtypeStruct((n, p), jnp.int32, sharding=sh)
    limits = jax.ShapeDtypeStruct(
      (n,),
      jnp.int32,
      sharding=mesh_lib.batch_sharding(mesh, 1, mesh_lib.ROLLOUT_RULES),
    )
    run = engine.jitted(
      continuous_loop.run,
      options,
      **continuous_loop.RUN_JIT,
    )
    refill_rows = continuous.default_refill_rows(
      rows, mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
    )
    refills = -(-n // refill_rows)  # each prefills refill_rows prompts
    lowered = run.lower(
      params, ids, ids, jax.random.key(0), 0, limits, slots=rows,
      refill_rows=refill_rows, refill_every=1,
      stop_sequences=(), **common,
    )  # fmt: skip
  else:
    ids = jax.ShapeDtypeStruct((rows, p), jnp.int32, sharding=sh)
    run = engine.jitted(
      sampler._sample,  # noqa: SLF001 - the jitted body
      options,
      **sampler._SAMPLE_JIT,  # noqa: SLF001
    )
    lowered = run.lower(
      params, ids, ids, jax.random.key(0), return_logits=False, **common
    )
  return dataclasses.replace(
    program_lib.analyse("rollout", lowered.compile()),
    rows=rows,
    estimate_bytes=0 if tree_shape else _estimate(cfg, model_cfg, mesh, rows),
    refills=refills,
    temp_budget_mib=budget if options else 0,
  )


def compile_sampler(
  name,
  cfg,
  sampler_cfg,
  model_cfg,
  mesh,
  hbm_bytes,
  resident,
  rows=0,
  models=1,
) -> program_lib.Program:
  """Another model's sampler in the run (aot.compile_run's `samplers`:
  rm_grpo's generative judge, ampo's teachers) as rollout.generate runs it
  there: at `sampler_cfg`'s prompts, tokens and rows, with the run's
  --rollout_rows (`rows`, else sized as the rollout's: rows_for), batching,
  --rollout_temp_budget_mib (from `cfg`, Context.sampler_kwargs) and the
  run's rollout dtype, decode attention and layout (Context.sampled_as).
  `Program.sampled` keeps (config, architecture, `models`: how many such
  models sample in turn) for its roofline time."""
  c = dataclasses.replace(
    sampler_cfg,
    rollout_rows=cfg.rollout_rows,
    rollout_batching=getattr(cfg, "rollout_batching", "static"),
    rollout_temp_budget_mib=getattr(cfg, "rollout_temp_budget_mib", 0),
    rollout_layout=getattr(cfg, "rollout_layout", "auto"),
    rollout_tensor=getattr(cfg, "rollout_tensor", 0),
    rollout_dtype=getattr(cfg, "rollout_dtype", ""),
    decode_attention=getattr(cfg, "decode_attention", "auto"),
  )
  rows = (
    rows or c.rollout_rows or rows_for(c, model_cfg, mesh, hbm_bytes, resident)
  )
  prog = compile_rollout(c, model_cfg, mesh, rows, hbm_bytes)
  return dataclasses.replace(
    prog,
    name=name,
    model_params=model_cfg.num_params(),
    sampled=(c, model_cfg, models),
  )
