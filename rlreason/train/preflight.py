"""Checks a run passes before any compute: paths, resume, mesh, memory,
prompts.

  preflight.check_paths(cfg, workdir)
  preflight.check_resume(cfg, workdir)      # config.json of an earlier run
  preflight.check_mesh(cfg)                 # the mesh flags split the devices
  preflight.check_batch_split(cfg)          # batches split over the mesh
  preflight.check_memory(cfg, model_cfg)    # the trained state can fit
  preflight.check_prompts(cfg, tok, examples, what="--data")
  preflight.check_run(cfg, name)            # all of them, as loop.train does

`BaseConfig.validate` checks each flag on its own; these check what needs
the file system or the data. Each raises config.ConfigError with one line
per problem, naming the flag or the file and row, before the warm start or
any compilation (exit code 2 through flags.run_main).
"""

import importlib.util
import json
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from absl import logging

from rlreason import config
from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason import storage
from rlreason.data import sources as data_lib
from rlreason.model import presets
from rlreason.model import transformer
from rlreason.train import context as context_lib
from rlreason.train import loaders
from rlreason.train import run_info
from rlreason.train import run_policy
from rlreason.train import sft
from rlreason.train import train_step as ts

# At most this many offending rows are listed in one error.
_ROWS_SHOWN = 5


def writable_dir_problem(flag: str, path: str) -> str | None:
  """Why `path` cannot hold a run's files (None if it can): it is created
  if missing and a probe file is written and removed. gs:// is not probed.
  """
  if not path or "://" in path:
    return None
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, f".rlreason-write-test-{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    return f"--{flag}={path} is not a writable directory: {e.strerror or e}"
  return None


def check_paths(cfg, workdir: str) -> None:
  """The workdir (and the warm-start cache, when one will be written) can
  be written; --model / --init_from name something that exists."""
  problems = [writable_dir_problem("workdir", workdir)]
  if sft.will_warm_start(cfg):
    problems.append(writable_dir_problem("cache_dir", cfg.cache_dir))
  compiled = run_info.compile_cache_dir(cfg)
  problems.append(writable_dir_problem("compile_cache", compiled))
  if cfg.model.lower() not in presets.PRESETS and not os.path.isdir(
    presets.checkpoint_dir(cfg.model)
  ):
    problems.append(
      f"--model={cfg.model}: neither a preset ({', '.join(presets.PRESETS)}),"
      f" a shipped checkpoint ({', '.join(presets.SHIPPED)}) nor a local "
      "checkpoint directory"
    )
  if cfg.init_from and "://" not in cfg.init_from:
    problems.append(init_from_problem(cfg.init_from))
  for name, (keywords, runs) in cfg.model_fields.items():
    for item in getattr(cfg, name).split(","):
      item = item.strip()
      if (
        not item
        or item in keywords
        or item.lower() in presets.PRESETS
        or "://" in item
      ):
        continue  # "" names none (ampo's --teachers= arm: plain GRPO)
      problems.append(init_from_problem(item, name, runs))
  problems += package_problems(cfg, workdir)
  _raise(problems)


def installed(module: str) -> bool:
  """Whether `module` (dotted) can be imported, without importing it."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


def package_problems(cfg, workdir: str) -> list[str]:
  """The optional packages a run's flags need, where they are missing (the
  run would otherwise fail at its first log line, after the warm start)."""
  problems = []
  if cfg.wandb_project and not installed("wandb"):
    problems.append(
      f"--wandb_project={cfg.wandb_project}: the wandb package is not "
      "installed (pip install -e '.[wandb]', or pip install wandb)"
    )
  problems.append(bucket_problem("workdir", workdir, cfg.tensorboard))
  return [p for p in problems if p]


def bucket_problem(flag: str, url: str, tensorboard: bool = False):
  """Why --flag=url cannot be written (None if it can or is local): a
  bucket needs setup.py's _GCS packages, epath's fsspec backend and, for
  TensorBoard events, tensorboardX's bucket writer."""
  if "://" not in url:
    return None
  missing = [] if _filesystem(url) else ["gcsfs"]
  if tensorboard and not installed("google.cloud.storage"):
    missing.append("google-cloud-storage")
  if not missing:
    return None
  return (
    f"--{flag}={url}: writing to a bucket needs {' and '.join(missing)} "
    "(pip install -e '.[tpu]' or '.[gpu]', or pip install "
    f"{' '.join(missing)})"
  )


def _filesystem(url: str) -> bool:
  """Whether fsspec (epath's backend for gs:// and the like) can open
  `url`'s protocol."""
  import fsspec  # noqa: PLC0415 - epath's dependency, for remote paths

  try:
    fsspec.get_filesystem_class(url.split("://", 1)[0])
  except (ImportError, ValueError):
    return False
  return True


def init_from_problem(
  path: str, name: str = "init_from", runs: bool = True
) -> str | None:
  """Why --name=path cannot be loaded (None if it can): a Hugging Face
  directory (a warm start's cache, an export, a downloaded model) or, where
  `runs`, an RL run's workdir or one of its checkpoints/<step> that holds a
  checkpoint (run_policy.locate's errors)."""
  flag = f"--{name}={path}"
  in_run = os.path.basename(os.path.dirname(os.path.abspath(path)))
  if not os.path.isdir(path) and in_run != "checkpoints":
    return f"{flag}: no such directory"
  try:
    kind, workdir, step = run_policy.locate(path)
    if kind == "workdir" and not runs:
      return f"{flag}: an RL run; this flag takes a Hugging Face directory"
    if kind == "workdir":
      run_policy.saved_step(workdir, step)
  except run_policy.CheckpointError as e:
    return f"{flag}: {e}"
  return None


def check_mesh(cfg) -> None:
  """--mesh_data / --mesh_fsdp / --mesh_tensor split the devices there are."""
  try:
    mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  except ValueError as e:
    _raise(
      [
        f"--mesh_data={cfg.mesh_data} --mesh_fsdp={cfg.mesh_fsdp} "
        f"--mesh_tensor={cfg.mesh_tensor}: {e}"
      ]
    )


def check_batch_split(cfg) -> None:
  """A minibatch splits over the mesh's batch shards and --rollout_tensor
  divides its devices (errors), and a micro-batch splits too (else a
  warning: XLA keeps its activations whole on groups of chips)."""
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  shards = mesh_lib.batch_divisor(mesh)
  problems = []
  if cfg.num_sequences // cfg.minibatches % shards:
    problems.append(
      f"Invalid config: a minibatch of {cfg.num_sequences // cfg.minibatches}"
      f" sequences cannot be split over {shards} batch shards of mesh "
      f"{dict(mesh.shape)}"
    )
  own = getattr(cfg, "critic_minibatches", 0)  # ppo's critic updates
  if own and not ts.group_minibatch(cfg, own, shards)[0]:
    problems.append(
      f"Invalid config: --critic_minibatches={own} leaves "
      f"{cfg.num_sequences // own} sequences per critic update, fewer than "
      f"the {shards} batch shards of mesh {dict(mesh.shape)}"
    )
  try:
    mesh_lib.rollout_mesh(mesh, cfg.rollout_tensor)
  except ValueError as e:
    problems.append(str(e))
  _raise(problems)
  if why := ts.unsplit(cfg, shards):
    logging.warning(
      "%s: XLA keeps each micro-batch's activations whole on groups of "
      "chips (more memory and time); --micro_batches=%d splits them",
      why,
      ts.splitting_micro_batches(cfg, shards),
    )


def state_bytes(
  cfg, model_cfg, training: bool = True, needs_ref: bool = False
) -> tuple[int, int, str]:
  """(weights, a lower bound on the bytes a run holds at once, what they
  are). The weights as loaded (--param_dtype); when they all train, Adam's
  two moments of each and, with global-norm clipping (--grad_clip > 0),
  the gradients, every one of which is held while their norm is taken;
  with `needs_ref` (a KL term), the frozen reference copy in the compute
  dtype (--dtype). LoRA: the frozen base alone, loaded so before
  --lora_quantize shrinks it (it is also the reference); an evaluation:
  the weights alone. Activations, the rollout's weights and cache and the
  adapters come on top."""
  shapes = jax.tree.leaves(transformer.param_shapes(model_cfg))
  weights = sum(x.size for x in shapes)
  loaded = sum(x.size * x.dtype.itemsize for x in shapes)
  dtype = model_cfg.param_dtype
  if not training:
    return weights, loaded, f"the weights in {dtype}"
  if cfg.lora_rank:
    return weights, loaded, f"LoRA's frozen base as loaded, in {dtype}"
  if getattr(cfg, "grad_clip", 0) > 0:
    need, what = 4 * loaded, "the weights, their gradients and Adam's two"
    what += f" moments in {dtype}"
  else:
    need, what = 3 * loaded, f"the weights and Adam's two moments in {dtype}"
  if needs_ref:
    need += weights * jnp.dtype(model_cfg.dtype).itemsize
    what += f", the KL reference in {model_cfg.dtype}"
  return weights, need, what


def check_memory(
  cfg,
  model_cfg,
  *,
  training: bool = True,
  needs_ref: bool = False,
  name: str = "",
) -> None:
  """The run's state (state_bytes, a lower bound) fits in the memory of
  all the devices there are (a CPU's: the host's RAM), or the run (or an
  evaluation: training=False) stops here instead of running out of memory
  as it loads the model. `name`: the flag naming the model (default
  --init_from / --model)."""
  have, where = devices.total_memory()
  weights, need, what = state_bytes(cfg, model_cfg, training, needs_ref)
  if have is None or need <= have:
    return
  if not training or cfg.lora_rank:
    fix = "--param_dtype=bfloat16"
  else:
    fix = "LoRA (--lora_rank)"
  _raise(
    [
      f"{name or f'--model={cfg.init_from or cfg.model}'}: "
      f"{weights / 1e9:.2f}B weights need at least {need / 2**30:.1f} GiB "
      f"for {what}, more than the {have / 2**30:.1f} GiB of {where}. Use a "
      f"smaller model, {fix} or a larger slice (python -m experiments.plan "
      "sizes one)"
    ]
  )


def check_resume(cfg, workdir: str) -> None:
  """A workdir that holds a run continues only that run.

  Fields outside run_info.RESUMABLE_CHANGES must match its config.json;
  --allow_config_change lets them differ and appends the change to
  config_changes.jsonl.
  """
  saved = storage.read_json(os.path.join(workdir, "config.json"))
  if not saved:
    return
  ignore = run_info.RESUMABLE_CHANGES
  if not cfg.init_from and cfg.warm_start_steps:
    ignore += ("init_from",)  # the warm start's cache, set later
  diff = run_info.differences(saved, cfg, ignore=ignore)
  if not diff:
    return
  now = {"class": run_info.class_name(cfg), **vars_of(cfg)}
  lines = [f"--{k}: {saved.get(k)!r} -> {now[k]!r}" for k in diff]
  if not cfg.allow_config_change:
    raise config.ConfigError(
      f"{workdir} holds a run with another config; it would resume with:\n  "
      + "\n  ".join(lines)
      + "\nUse another --workdir, or pass --allow_config_change to resume "
      "with the new settings (recorded in config_changes.jsonl)."
    )
  logging.warning("Resuming %s with changed settings: %s", workdir, lines)
  path = os.path.join(workdir, "config_changes.jsonl")
  with open(path, "a") as f:
    record = {
      "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      "changes": {k: [saved.get(k), now[k]] for k in diff},
    }
    f.write(json.dumps(record) + "\n")


def vars_of(cfg) -> dict:
  return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def check_prompts(cfg, tokenizer, examples, what: str) -> int:
  """Prompts over --max_prompt_len: an error naming each row, or (with
  --truncate_prompts) the number that will be cut. Checks the first
  --validate_rows examples (all with 0). Returns the number over budget."""
  rows = examples[: cfg.validate_rows] if cfg.validate_rows else examples
  lengths = [
    len(ids)
    for ids in context_lib.prompt_ids(
      tokenizer, rows, cfg.template, max_len=None
    )
  ]
  over = [(e, n) for e, n in zip(rows, lengths) if n > cfg.max_prompt_len]
  if not over:
    return 0
  if cfg.truncate_prompts:
    logging.warning(
      "%s: %d of %d prompts are longer than --max_prompt_len=%d; they are "
      "cut to their last %d tokens (--truncate_prompts).",
      what,
      len(over),
      len(rows),
      cfg.max_prompt_len,
      cfg.max_prompt_len,
    )
    return len(over)
  lines = [
    f"{e.uid}: the prompt has {n} tokens, more than --max_prompt_len="
    f"{cfg.max_prompt_len}"
    for e, n in over[:_ROWS_SHOWN]
  ]
  if len(over) > _ROWS_SHOWN:
    lines.append(f"... and {len(over) - _ROWS_SHOWN} more")
  raise config.ConfigError(
    f"{what}: {len(over)} of {len(rows)} prompts are over the budget:\n  "
    + "\n  ".join(lines)
    + f"\nRaise --max_prompt_len (longest: {max(n for _, n in over)}) or "
    "pass --truncate_prompts to keep each prompt's last tokens."
  )


def _raise(problems) -> None:
  problems = [p for p in problems if p]
  if problems:
    raise config.ConfigError("\n".join(problems))


def trained_on(cfg, train, evaluated) -> int:
  """How many evaluation problems are also training problems (the same
  question): without --eval_data, a data file is evaluated on its own
  first --eval_size rows. Warns when any are; returns the count."""
  seen = {e.question for e in train}
  shared = sum(e.question in seen for e in evaluated)
  if shared:
    logging.warning(
      "%d of %d evaluation problems are also in --data=%s: the evaluation "
      "is not held out; --eval_data=SPEC names problems to hold out.",
      shared,
      len(evaluated),
      cfg.data,
    )
  return shared


class Checked(NamedTuple):
  """What check_run loaded to check a run, for the run to keep."""

  cfg: Any  # --init_from pinned to one step of a run
  workdir: str
  train_examples: list
  eval_examples: list
  tokenizer: Any
  reward_fn: Callable  # loaders.make_reward_fns's pair
  correct_fn: Callable


def check_run(cfg, name: str, needs_ref: bool | None = None) -> Checked:
  """Everything checkable before any compute (warm start, compilation):
  the paths, the workdir's earlier run, the mesh, the memory, the data, its
  prompts and the reward. Returns what it loaded for that (Checked). An
  experiment that computes before `train` (a warm start of its own, a
  reward model) calls it first.
  """
  if needs_ref is None:
    needs_ref = getattr(cfg, "needs_ref", False)
  workdir = run_info.workdir_for(cfg, name)
  check_paths(cfg, workdir)
  cfg = loaders.pinned(cfg, workdir)  # --init_from=<a run>: one step of it
  run_info.use_compile_cache(cfg)
  check_resume(cfg, workdir)
  check_mesh(cfg)
  check_batch_split(cfg)
  check_memory(cfg, loaders.model_config(cfg), needs_ref=needs_ref)
  eval_spec = context_lib.eval_spec(cfg)
  train_examples = data_lib.load(cfg.data, "train")
  eval_examples = data_lib.load(eval_spec, "eval")[: cfg.eval_size]
  tok = loaders.load_tokenizer(cfg)
  check_prompts(cfg, tok, train_examples, f"--data={cfg.data}")
  check_prompts(cfg, tok, eval_examples, f"eval data {eval_spec}")
  reward_fn, correct_fn = loaders.make_reward_fns(cfg)  # --reward is known
  return Checked(
    cfg, workdir, train_examples, eval_examples, tok, reward_fn, correct_fn
  )
