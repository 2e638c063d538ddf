"""A run's model, tokenizer and reward functions, from its flags.

  model_cfg, params = loaders.load_model(cfg, mesh)   --init_from / --model
  tok = loaders.load_tokenizer(cfg)                   --tokenizer
  reward_fn, correct_fn = loaders.make_reward_fns(cfg)   --reward / --data

The loop (loop.py), sft.py, evaluate.py, trained.py and experiments that
load a second model (rm_grpo's judge) share them. --init_from names a
Hugging Face directory or another RL run (its workdir: the latest
checkpoint, or one of its checkpoints/<step>, local or gs://), whose policy
(a LoRA run's merged) and tokenizer the run starts from (run_of).
"""

import dataclasses
import functools
import os
import sys
from typing import Callable

import jax
import numpy as np
from absl import logging

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason import rewards as rewards_lib
from rlreason import storage
from rlreason.data import sources as data_lib
from rlreason.model import hf
from rlreason.model import lora
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.train import adapters as adapters_lib
from rlreason.train import run_policy


def run_of(cfg):
  """(recorded config, workdir, step) of the RL run --init_from names (step
  None: its latest checkpoint); None when --init_from is unset or a
  Hugging Face directory."""
  if not cfg.init_from:
    return None
  kind, path, step = run_policy.locate(cfg.init_from)
  if kind != "workdir":
    return None
  raw = run_policy.read_json(os.path.join(path, "config.json"))
  return run_policy.recorded_config(raw), path, step


def pinned(cfg, workdir: str):
  """`cfg` with an --init_from that names a run's latest checkpoint pinned
  to one step (<run>/checkpoints/<step>, what config.json records): the
  step this workdir's first start took, so that a resumed run keeps its
  start and its KL reference (built from it again) while the other run
  goes on; else that run's latest now."""
  run = run_of(cfg)
  if run is None or run[2] is not None:
    return cfg
  source, step = run[1].rstrip("/"), None
  saved = storage.read_json(os.path.join(workdir, "config.json")) or {}
  prefix = f"{source}/checkpoints/"  # as this function records it
  recorded = saved.get("init_from", "")
  if recorded.startswith(prefix) and recorded[len(prefix) :].isdigit():
    step = int(recorded[len(prefix) :])
  try:
    step = run_policy.saved_step(source, step)
  except run_policy.CheckpointError as e:
    raise config.ConfigError(
      f"--init_from={cfg.init_from}: {workdir} started from its step "
      f"{step}: {e}"
    ) from None
  return dataclasses.replace(cfg, init_from=f"{prefix}{step}")


def run_params(run_cfg, workdir: str, step: int | None, mesh):
  """(model_cfg, params, adapters, step) of an RL run's checkpoint (the
  latest where step is None): a LoRA run's adapters merged into the base
  it started from (params), and the adapters themselves; else adapters
  None."""
  if lcfg := adapters_lib.lora_config(run_cfg):
    model_cfg, base = load_model(run_cfg, mesh)
    adapted, fresh = adapters_lib.prepare(run_cfg, model_cfg, base, mesh, lcfg)
    adapters, step = run_policy.restore_params(
      workdir, model_cfg, mesh, step, like=fresh, axes=adapted.axes
    )
    return model_cfg, adapted.policy(adapters), adapters, step
  model_cfg = model_config(run_cfg)
  params, step = run_policy.restore_params(workdir, model_cfg, mesh, step)
  return model_cfg, params, None, step


def model_config(cfg) -> transformer.ModelConfig:
  """The architecture load_model gives, without reading any weights."""
  if run := run_of(cfg):
    return _as_this_run(model_config(run[0]), cfg)
  source = cfg.init_from or presets.checkpoint_dir(cfg.model)
  if os.path.isdir(source):
    model_cfg = hf.config_from_hf(
      hf.read_config(source),
      source=os.path.join(source, "config.json"),
      dtype=cfg.param_dtype,
      compute_dtype=cfg.dtype,
    )
    return dataclasses.replace(model_cfg, **cfg.model_settings())
  return presets.get(
    cfg.model,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    **cfg.model_settings(),
  )


def load_model(cfg, mesh):
  """(model_cfg, params) from --init_from (an RL run's checkpoint, an HF
  directory), --model's HF directory or a preset."""
  if run := run_of(cfg):
    model_cfg, params, _, step = run_params(*run, mesh)
    if jax.process_index() == 0:
      print(f"Starting from {run[1]}, step {step}", file=sys.stderr)
    model_cfg = _as_this_run(model_cfg, cfg)
    # A LoRA run's policy as plain params (over a quantised base, its
    # kernels are formed at use), in this run's dtype and layout.
    dtype = jax.numpy.dtype(cfg.param_dtype)
    params = jax.tree.map(
      lambda x, s: jax.device_put(x.astype(dtype), s),
      lora.formed_once(params),
      _train_shardings(model_cfg, mesh),
    )
    return model_cfg, params
  source = cfg.init_from or presets.checkpoint_dir(cfg.model)
  if os.path.isdir(source):
    model_cfg, params = hf.load(
      source, mesh=mesh, dtype=cfg.param_dtype, compute_dtype=cfg.dtype
    )
    model_cfg = dataclasses.replace(model_cfg, **cfg.model_settings())
    return model_cfg, params
  model_cfg = model_config(cfg)
  init = jax.jit(
    functools.partial(transformer.init, model_cfg),
    out_shardings=_train_shardings(model_cfg, mesh),
  )
  return model_cfg, init(jax.random.key(cfg.seed))


def _as_this_run(model_cfg, cfg):
  """Another run's architecture with this run's dtypes and settings."""
  dtypes = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype)
  return dataclasses.replace(model_cfg, **dtypes, **cfg.model_settings())


def _train_shardings(model_cfg, mesh):
  return mesh_lib.shardings(
    mesh,
    transformer.param_axes(model_cfg),
    mesh_lib.TRAIN_RULES,
    transformer.param_shapes(model_cfg),
  )


def load_tokenizer(cfg):
  """The tokenizer of tokenizer_source(cfg)."""
  return tokenizer_lib.load(tokenizer_source(cfg))


def tokenizer_source(cfg) -> str:
  """--tokenizer, else the tokenizer saved with --init_from or --model (an
  RL run's: the one it recorded), else "char".

  --model is checked too: a warm start's cache directory (--init_from) holds
  weights only, and the char tokenizer would silently not match the model.
  """
  if cfg.tokenizer:
    return cfg.tokenizer
  if run := run_of(cfg):
    return tokenizer_source(run[0])
  for source in (cfg.init_from, presets.checkpoint_dir(cfg.model)):
    if os.path.isdir(source) and os.path.exists(
      os.path.join(source, "tokenizer_config.json")
    ):
      return source
  return "char"


def make_reward_fns(cfg):
  """(shaped reward, 0/1 correctness) from --reward and --data."""
  kind, location, _ = data_lib.parse_spec(cfg.data)
  correct_name = f"task:{location}" if kind == "task" else "math"
  name = correct_name if cfg.reward in ("task", "") else cfg.reward
  try:
    reward_fn = FiniteRewards(rewards_lib.combine({name: 1.0}))
  except KeyError as e:  # str(KeyError) adds quotes
    raise config.ConfigError(f"--reward={cfg.reward}: {e.args[0]}") from None
  correct = rewards_lib.get(correct_name)
  return reward_fn, correct


class FiniteRewards:
  """A reward function whose non-finite rewards (NaN, inf) are counted and
  reported with their rows; the loop skips the step's update when any were
  seen (Context.take_nonfinite_rewards), whatever the advantage estimator
  would make of them (a group normalisation would zero a NaN's group)."""

  def __init__(self, fn: Callable):
    self.fn = fn
    self.nonfinite = 0

  def __call__(self, completions, answers, **kwargs):
    total, parts = self.fn(completions, answers, **kwargs)
    bad = np.flatnonzero(~np.isfinite(np.asarray(total, np.float64)))
    if len(bad):
      self.nonfinite += len(bad)
      i = int(bad[0])
      logging.warning(
        "%d of %d rewards are not finite (rows %s); first: row %d = %s for "
        "completion %r (answer %r). The step's update is skipped.",
        len(bad),
        len(total),
        bad[:10].tolist(),
        i,
        np.asarray(total)[i],
        completions[i][:200],
        answers[i] if answers is not None else None,
      )
    return total, parts
