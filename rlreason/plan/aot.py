"""Ahead-of-time compilation of a run's programs, on abstract arrays.

  programs = aot.compile_run(cfg, loss_fn, mesh)   # {"train_step": ..., ...}
  programs["train_step"].temp_bytes, .largest, .flops

Params and optimizer state are ShapeDtypeStructs (jax.eval_shape, built in
plan/state.py): nothing is materialised, so a 32B model plans on a laptop.
The train steps are compiled in plan/training.py, the rollout in
plan/rollout.py, the whole-rollout forwards (reference, critic, scorers)
in plan/scoring.py.
The mesh is usually an abstract TPU slice (chips.devices), compiled by
libtpu on this CPU host; with jax.devices() it plans for the local backend.

The programs, each compiled where the run has it, at the sizes it runs them:
  train_step  one minibatch (N / minibatches rows) through loss, gradient
              (micro_batches scanned) and optimizer update, state donated;
  rollout     the sampler (prefill + decode loop) at --rollout_rows
              sequences per call (default: what the HBM left beside the
              train state holds, rollout_memory.rows_per_call, as the loop
              sizes its calls), parameters laid out as mesh.rollout_rules
              chooses for the slice's HBM (over the fit with them
              replicated: again split over fsdp, retry.sharded_params);
  ref_logp    the reference / old-logp forward over --score_rows rows
              (default: one train micro-batch, as Context.score_rows);
  values      with a critic (ppo's extra_params): its rollout-time forward
              over as many rows;
  teacher,    with frozen models the run scores its rollouts with
  reward_model  (`scorers`, {program: --model name}: KDRL's teacher,
              eval/teacher.py's Teacher.logp; rm_grpo's scalar reward
              model, rewards/model.py's score_rollout): each one's forward
              over as many rows, its parameters in the compute dtype
              resident beside every other program (SCORERS);
  reward_model_train  with a reward model trained before the RL
              (`reward_model_pairs` pairs per step: rm_grpo's
              Bradley-Terry step, rewards/bradley_terry.py's bt_update), beside
              the policy's weights as loaded;
  judge,      with other models that sample in the run (`samplers`,
  teachers    {program: the config they sample at, or a program.Sampler
              of it and how many such models}: rm_grpo's generative judge,
              rewards/judge.py; ampo's teachers, eval/teacher.py): the
              rollout program at that config, in calls sized as the
              rollout's, the models' weights as the run keeps them (the
              compute dtype, TRAIN_RULES) resident beside every program,
              their own sampler's too (which samples from a copy in the
              rollout layout), timed once per model.
An experiment that trains more than the policy passes its loop hook
(`extra_params`, e.g. ppo.critic(cfg)) and the per-row shapes of the batch
fields its loss reads beyond the policy's (`fields`); the train state, the
optimizer's learning-rate groups and the train step's batch include them.
A critic that takes updates of its own (ppo --critic_minibatches: its own
optimizer) makes the train step the policy's alone, and its updates a
program of their own:
  critic_step the critic alone on its loss over one of its minibatches
              (train_step.group_minibatch's rows and micro-batches),
              state donated; timed per call times its calls per step.
Each program's peak adds the bytes that stay resident beside it
(state.resident_bytes): the train state (parameters and optimizer moments)
during the rollout and the reference forward, and the reference parameters
of KL runs during the rollout and the train step.
cost_analysis() counts a while-loop body once: `flops` is XLA's count as
is (see plan/summary.py for the step time), `bytes_accessed` multiplies
each loop body's bytes by its trip count (program.analyse, hlo_loops: the
micro-batch scan, and the loops nested in it such as the logits chunks).
"""

import dataclasses
import functools
import os

from rlreason import mesh as mesh_lib
from rlreason.model import presets
from rlreason.model import transformer
from rlreason.plan import program as program_lib
from rlreason.plan import retry
from rlreason.plan import rollout as rollout_lib
from rlreason.plan import scoring
from rlreason.plan import state as state_lib
from rlreason.plan import training
from rlreason.sampling import rollout_memory
from rlreason.train import train_step as ts


# Every program a run may execute (compile_run's default; each compiled
# where the run has it).
PROGRAMS = (
  "train_step",
  "critic_step",
  "rollout",
  "ref_logp",
  "values",
  "teacher",
  "reward_model",
  "reward_model_train",
  "judge",
  "teachers",
)
# Programs of other models that sample in a run (`samplers`).
SAMPLERS = ("judge", "teachers")


def tpu_env() -> None:
  """Env for libtpu's compiler on a host without TPUs (before jax loads)."""
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-16")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # No TPU is touched: several planners (parallel test workers) may run.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # JAX's persistent cache writes a compile-only TPU program but cannot read
  # it back ("PjRtCompiler must be constructed with a Client to call
  # DeserializeLoadedExecutable"): off, so no run writes entries it will
  # only warn about.
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"


def model_config(cfg) -> transformer.ModelConfig:
  """The architecture of cfg.model (a preset, or a checkpoint path whose
  name is a known architecture), in the run's dtypes, remat and sequence
  split."""
  arch = presets.architecture(cfg.model)
  if arch is None:
    raise ValueError(
      f"--model={cfg.model}: no known architecture for this name; add it to "
      "model/presets.py (PRESETS or ARCHITECTURE_OF)"
    )
  return presets.get(
    arch,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    **cfg.model_settings(),
  )


def scorer_config(cfg, model: str):
  """A scoring model's architecture (`model`: a --model name or checkpoint
  path), in the run's dtypes, or None without one."""
  if not model:
    return None
  return model_config(dataclasses.replace(cfg, model=model))


def _replicates(cfg, model_cfg, mesh, hbm_bytes) -> bool:
  """Whether the auto layout (mesh.rollout_rules for `hbm_bytes`, as
  plan/state.rollout_params lays them out) replicates the rollout's
  parameters over an fsdp axis of more than one device (of the sampler's
  mesh: mesh.rollout_mesh)."""
  mesh = mesh_lib.rollout_mesh(mesh, getattr(cfg, "rollout_tensor", 0))
  if getattr(cfg, "rollout_layout", "auto") != "auto" or (
    mesh.shape["fsdp"] == 1
  ):
    return False
  param_bytes = model_cfg.num_params() * state_lib.compute_bytes(model_cfg)
  return mesh_lib.replicates(param_bytes, mesh.shape["tensor"], hbm_bytes)


def _more_rows(compiler, prog, cfg, model_cfg, hbm_bytes, resident: int):
  """compiler.more_rows, up to the rows the run would take on a chip of
  `hbm_bytes` (rollout_memory.call_rows: its free memory were the
  estimate ESTIMATE_OVERCOUNT times too high), with the flags the
  rollout's retries set (e.g. --rollout_layout=fsdp)."""
  if retry.over(prog, compiler.fit_bytes):
    return prog
  c = dataclasses.replace(cfg, **prog.run_flags)
  most = rollout_lib.rows_for(
    c,
    model_cfg,
    compiler.mesh,
    hbm_bytes,
    resident,
    overcount=rollout_memory.ESTIMATE_OVERCOUNT,
  )
  return compiler.more_rows(prog, c, most)


def compile_run(
  cfg,
  loss_fn,
  mesh,
  *,
  programs=PROGRAMS,
  rollout_rows: int = 0,
  score_rows: int = 0,
  hbm_bytes: int | None = None,
  extra_params=None,
  fields=None,
  scorers: dict[str, str] | None = None,
  reward_model_pairs: int = 0,
  samplers: dict | None = None,
  model_cfg=None,
  fit_bytes: int | None = None,
  stop_over_fit: bool = False,
  more_rows: bool = False,
  progress=None,
) -> dict[str, program_lib.Program]:
  """The run's programs compiled for `mesh`; failures (e.g. out of HBM)
  are returned as the exception instead of a Program. "values" is
  compiled only when `extra_params` adds a critic, a scorer (SCORERS)
  only where `scorers` names its model, "reward_model_train" only with
  `reward_model_pairs` and a reward model. `model_cfg` replaces
  model_config(cfg) (e.g. another attention implementation).

  `fit_bytes` (TPU, no budget flag given): a train step or rollout whose
  peak exceeds it is compiled again under the temporaries budget that
  would hold it there (retry.budgeted), as the run would with that flag
  (program.TEMP_BUDGETS); a train step still over it, in more
  micro-batches (retry.more_micro_batches: --micro_batches in the run,
  and the later programs compiled as that run would run them). With
  `stop_over_fit`, the programs after the first that fails or peaks over
  `fit_bytes` are not compiled (a slice search's misses cost one program).
  With `more_rows`, a rollout that fits at the rows per call sized from
  its estimate is compiled again at the rows its peak says the fit holds
  (retry.more_rows; up to what the run takes, rollout_memory.call_rows).
  `progress(line)` is told each compile's start, seconds and peak.
  """
  model_cfg = model_cfg or model_config(cfg)
  scorer_cfgs = {
    name: scorer_config(cfg, model)
    for name, model in (scorers or {}).items()
    if model
  }
  # Other samplers' configs and architectures (scorer_config: the run's
  # dtypes), their weights as the run keeps them: frozen, in the train
  # layout and the compute dtype (rm_grpo.judge_reward).
  samplers = {
    name: s if isinstance(s, program_lib.Sampler) else program_lib.Sampler(s)
    for name, s in (samplers or {}).items()
  }
  if unknown := set(samplers) - set(SAMPLERS):
    raise ValueError(
      f"samplers {sorted(unknown)}: a sampler program is one of {SAMPLERS}"
    )
  sampler_cfgs = {
    name: (s.config, scorer_config(cfg, s.config.model))
    for name, s in samplers.items()
  }
  loaded = {
    name: samplers[name].models
    * state_lib.per_device_bytes(state_lib.ref_params(m, mesh))
    for name, (_, m) in sampler_cfgs.items()
  }
  resident = state_lib.resident_bytes(
    cfg,
    model_cfg,
    mesh,
    extra_params,
    frozen={
      **{
        name: state_lib.per_device_bytes(scoring.SCORERS[name][1](c, mesh))
        for name, c in scorer_cfgs.items()
      },
      **loaded,
    },
  )
  for name, b in loaded.items():  # beside the sampler's rollout-layout copy
    resident[name] += b
  critic = state_lib.critic_params(cfg, model_cfg, mesh, extra_params)
  if critic is None:
    programs = tuple(p for p in programs if p != "values")
  if training.own_updates(cfg, model_cfg, extra_params) is None:
    programs = tuple(p for p in programs if p != "critic_step")
  programs = tuple(
    p for p in programs if p not in scoring.SCORERS or p in scorer_cfgs
  )
  if not (reward_model_pairs and "reward_model" in scorer_cfgs):
    programs = tuple(p for p in programs if p != "reward_model_train")
  programs = tuple(
    p for p in programs if p not in SAMPLERS or p in sampler_cfgs
  )
  rows = score_rows or ts.score_rows(cfg, mesh)
  fixed_rows = rollout_rows or cfg.rollout_rows
  makers = {  # each compiles with a config (a budget flag set, below)
    "train_step": lambda c: training.compile_train_step(
      c, model_cfg, mesh, loss_fn, extra_params, fields
    ),
    "critic_step": lambda c: training.compile_train_step(
      c, model_cfg, mesh, loss_fn, extra_params, fields, "critic_step"
    ),
    "rollout": lambda c: rollout_lib.compile_rollout(
      c,
      model_cfg,
      mesh,
      rollout_rows
      or c.rollout_rows
      or rollout_lib.rows_for(
        c, model_cfg, mesh, hbm_bytes, resident["rollout"]
      ),
      hbm_bytes,
    ),
    # The loop scores the rollout one train micro-batch at a time
    # (Context.score_rows).
    "ref_logp": lambda c: scoring.compile_ref_logp(c, model_cfg, mesh, rows),
    "values": lambda c: scoring.compile_values(
      c, model_cfg, mesh, rows, critic
    ),
  }
  if "reward_model" in scorer_cfgs:
    makers["reward_model_train"] = lambda c: scoring.compile_reward_model_train(
      c, scorer_cfgs["reward_model"], mesh, reward_model_pairs
    )
  for name, (sampler_cfg, sampler_model) in sampler_cfgs.items():
    makers[name] = functools.partial(
      lambda c, n, sc, sm: rollout_lib.compile_sampler(
        n,
        c,
        sc,
        sm,
        mesh,
        hbm_bytes,
        resident[n],
        rollout_rows,
        samplers[n].models,
      ),
      n=name,
      sc=sampler_cfg,
      sm=sampler_model,
    )
  for name, scorer_cfg in scorer_cfgs.items():
    makers[name] = functools.partial(
      lambda c, n, sc: scoring.compile_scorer(n, c, sc, mesh, rows),
      n=name,
      sc=scorer_cfg,
    )

  compiler = retry.Retrying(makers, resident, mesh, fit_bytes, progress)
  out = {}
  for name in programs:
    try:
      out[name] = compiler.compile_one(name, cfg)
      if name == "rollout" and fit_bytes and not fixed_rows:
        out[name] = compiler.fewer_rows(out[name], cfg)
    except Exception as e:  # noqa: BLE001 - XLA reports OOM as a RuntimeError
      out[name] = e
    if (
      name == "rollout"
      and fit_bytes
      and _replicates(cfg, model_cfg, mesh, hbm_bytes)
    ):
      out[name] = compiler.sharded_params(out[name], cfg, not fixed_rows)
    if name == "rollout" and fit_bytes and more_rows and not fixed_rows:
      out[name] = _more_rows(
        compiler, out[name], cfg, model_cfg, hbm_bytes, resident["rollout"]
      )
    if name == "train_step" and fit_bytes:
      out[name] = compiler.more_micro_batches(
        out[name], cfg, cfg.num_sequences // cfg.minibatches, name
      )
      if isinstance(out[name], program_lib.Program):
        # The run's micro-batches: the forwards score as many rows each.
        cfg = dataclasses.replace(cfg, **out[name].run_flags)
        rows = score_rows or ts.score_rows(cfg, mesh)
    if name == "reward_model_train" and fit_bytes:
      out[name] = compiler.more_micro_batches(
        out[name], cfg, reward_model_pairs, name
      )
    if stop_over_fit and fit_bytes and retry.over(out[name], fit_bytes):
      break  # the slice does not fit: the rest would not change that
  return out
