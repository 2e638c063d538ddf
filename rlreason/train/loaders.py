"""A run's model, tokenizer and reward functions, from its flags.

  model_cfg, params = loaders.load_model(cfg, mesh)   --init_from / --model
  tok = loaders.load_tokenizer(cfg)                   --tokenizer
  reward_fn, correct_fn = loaders.make_reward_fns(cfg)   --reward / --data

The loop (loop.py), sft.py, evaluate.py, trained.py and experiments that
load a second model (rm_grpo's judge) share them.
"""

import dataclasses
import functools
import os
from typing import Callable

import jax
import numpy as np
from absl import logging

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason import rewards as rewards_lib
from rlreason.data import sources as data_lib
from rlreason.model import hf
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer


def model_config(cfg) -> transformer.ModelConfig:
  """The architecture load_model gives, without reading any weights."""
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
  """(model_cfg, params) from --init_from, an HF directory or a preset."""
  source = cfg.init_from or presets.checkpoint_dir(cfg.model)
  if os.path.isdir(source):
    model_cfg, params = hf.load(
      source, mesh=mesh, dtype=cfg.param_dtype, compute_dtype=cfg.dtype
    )
    model_cfg = dataclasses.replace(model_cfg, **cfg.model_settings())
    return model_cfg, params
  model_cfg = model_config(cfg)
  shardings = mesh_lib.shardings(
    mesh,
    transformer.param_axes(model_cfg),
    mesh_lib.TRAIN_RULES,
    transformer.param_shapes(model_cfg),
  )
  init = jax.jit(
    functools.partial(transformer.init, model_cfg), out_shardings=shardings
  )
  return model_cfg, init(jax.random.key(cfg.seed))


def load_tokenizer(cfg):
  """--tokenizer, else the tokenizer saved with --init_from or --model.

  --model is checked too: a warm start's cache directory (--init_from) holds
  weights only, and the char tokenizer would silently not match the model.
  """
  if cfg.tokenizer:
    return tokenizer_lib.load(cfg.tokenizer)
  for source in (cfg.init_from, presets.checkpoint_dir(cfg.model)):
    if os.path.isdir(source) and os.path.exists(
      os.path.join(source, "tokenizer_config.json")
    ):
      return tokenizer_lib.load(source)
  return tokenizer_lib.load("char")


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
