"""An experiment file as the planner reads it (experiments/plan.py, one
slice; experiments/plan_all.py, every PAPER preset): its config at a
scale with overrides (`--set`), the hooks that say what its run holds
beyond the policy, and the micro-batches that split over a slice.
"""

import dataclasses
import importlib
import pkgutil

from rlreason.plan import chips
from rlreason.rl import objective
from rlreason.train import train_step as ts

import experiments

# Not paper methods: the planner, reproduction and evaluation tools.
NOT_METHODS = (
  "reproduce",
  "evaluate",
  "claims",
  "plan",
  "plan_all",
  "plan_hooks",
)


def experiment_names() -> list[str]:
  return sorted(
    m.name
    for m in pkgutil.iter_modules(experiments.__path__)
    if not m.ispkg and m.name not in NOT_METHODS
  )


def config_fields(name: str) -> set[str]:
  """The fields of experiments/<name>.py's Config (its flags)."""
  module = importlib.import_module(f"experiments.{name}")
  return {f.name for f in dataclasses.fields(module.Config)}


def experiment_config(name: str, scale: str, overrides: dict):
  """(cfg, loss_fn, extras) of an experiment at a scale, with overrides.

  An experiment module tells the planner what its run holds beyond the
  policy: `critic(cfg)`, its loop hook for parameters trained beside the
  policy; `train_fields(cfg)`, {batch field: per-row shape} its loss reads
  beyond objective.loss_fn's, or at another shape (IGPO's token-level
  adv); `plan_config(cfg)`, the config whose shapes
  its programs run at (when they are not the flags' own);
  `scorers(cfg)`, {program: --model name} of the frozen models it scores
  its rollouts with (plan/scoring.py's SCORERS: KDRL's teacher, rm_grpo's
  reward model); `reward_model_pairs(cfg)`, the pairs per step of a
  reward model it trains before the RL (rm_grpo's Bradley-Terry stage);
  `samplers(cfg)`, {program: config} of other models that sample in the
  run (rm_grpo's generative judge, ampo's teachers: a config, or a
  plan/program.Sampler of it and how many models); and, read by
  `plan`, `decode_tokens(cfg)`, the completion tokens its rollout decodes
  (when not all), and `score_forwards(cfg)`, the whole-batch forwards
  per step beyond the reference's (IGPO's answer probabilities).
  `extras` are aot.compile_run's keywords for the first two, the
  scorers, the reward model's pairs and the samplers.
  """
  module = importlib.import_module(f"experiments.{name}")
  cfg = module.Config()
  if scale == "paper":
    cfg = dataclasses.replace(cfg, **module.PAPER)
  cfg = dataclasses.replace(cfg, **overrides)
  resolve = getattr(module, "resolve", None)
  cfg = resolve(cfg) if resolve else cfg
  shaped = getattr(module, "plan_config", None)
  cfg = shaped(cfg) if shaped else cfg
  extras = {}
  if hasattr(module, "critic"):
    extras["extra_params"] = module.critic(cfg)
  if hasattr(module, "train_fields"):
    extras["fields"] = module.train_fields(cfg)
  if hasattr(module, "scorers"):
    extras["scorers"] = module.scorers(cfg)
  if hasattr(module, "reward_model_pairs"):
    extras["reward_model_pairs"] = module.reward_model_pairs(cfg)
  if hasattr(module, "samplers"):
    extras["samplers"] = module.samplers(cfg)
  return cfg, getattr(module, "loss_fn", objective.loss_fn), extras


def hook(name: str, hook: str, cfg) -> int:
  """The experiment's `hook(cfg)` (decode_tokens: the completion tokens
  per row its rollout decodes, multi-turn: the actions'; score_forwards:
  its extra whole-batch forwards), else 0 (decode_tokens: all; no extra
  forwards)."""
  fn = getattr(importlib.import_module(f"experiments.{name}"), hook, None)
  return fn(cfg) if fn else 0


def _shards(cfg, slice_name: str) -> int:
  return ts.batch_shards(cfg, chips.parse(slice_name).chips)


def unsplit_on(name: str, slice_name: str, overrides=None) -> str:
  """train_step.unsplit for a PAPER preset on a slice, without compiling."""
  cfg = experiment_config(name, "paper", overrides or {})[0]
  return ts.unsplit(cfg, _shards(cfg, slice_name))


def split_overrides(name, scale, slice_name, overrides: dict) -> dict:
  """{"micro_batches": n} where the config's micro-batch (the preset's,
  with `overrides`) does not split over the slice's chips and n does
  (train_step.splitting_micro_batches): fewer weight re-reads, and no
  activations kept whole on groups of chips. {} where it splits already
  (or no count would)."""
  cfg = experiment_config(name, scale, overrides)[0]
  mb = ts.splitting_micro_batches(cfg, _shards(cfg, slice_name))
  return {"micro_batches": mb} if mb and mb != cfg.micro_batches else {}


def parse_set(text: str) -> dict:
  """--set's "k=v,..." as config overrides: ints, floats, booleans (true /
  false in any case, as absl takes them), else strings."""
  out = {}
  for item in filter(None, text.split(",")):
    key, _, value = item.partition("=")
    for kind in (int, float):
      try:
        value = kind(value)
        break
      except ValueError:
        pass
    if isinstance(value, str) and value.lower() in ("true", "false"):
      value = value.lower() == "true"
    out[key] = value
  return out
