"""A trained policy from wherever it lives, and its export to Hugging Face.

  policy = trained.load("workdirs/grpo")              # latest checkpoint
  policy = trained.load("workdirs/grpo/checkpoints/40")
  policy = trained.load("/ckpt/Qwen2.5-Math-1.5B")    # HF directory
  policy = trained.load("tiny")                       # preset, random init
  trained.export_hf(policy, "out/hf")  # config.json + safetensors

An RL workdir's params come from its orbax checkpoint (params only; the
optimizer state is not read: train/run_policy.py). Its architecture,
tokenizer, template, lengths and seed come from the config.json the run
recorded (run_info.write_run_info), so evaluating a workdir
(rlreason/eval/evaluate.py) reproduces the loop's own evaluation. An
exported directory carries those settings in rlreason.json. Workdirs may be
on gs://; Hugging Face directories and exports are local.
"""

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import safetensors.numpy

from rlreason import config
from rlreason.train import adapters as adapters_lib
from rlreason.train import loaders
from rlreason.train import preflight
from rlreason.train import run_policy
from rlreason import mesh as mesh_lib
from rlreason.model import hf
from rlreason.model import hf_layout
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer

CheckpointError = hf.CheckpointError
EXPORT_INFO = "rlreason.json"  # written next to an exported HF checkpoint
_TOKENIZER_FILES = (
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "chat_template.jinja",
  "chat_template.json",
)


@dataclasses.dataclass
class Policy:
  """Params and everything needed to sample from them.

  Attributes:
    source: the checkpoint as given (path or preset name).
    kind: "workdir", "hf" or "preset".
    model_cfg, params: the model; params sharded on `mesh` (TRAIN_RULES).
    mesh: the mesh the params live on.
    run_cfg: the recorded run's settings (template, lengths, seed, data);
      BaseConfig defaults when `recorded` is False.
    recorded: whether run_cfg comes from a run (workdir or exported dir).
    tokenizer: "char" or a directory with tokenizer files.
    step: the checkpoint step (workdirs and their exports), else None; it
      is folded into the sampling key, as in the loop's evaluations.
    workdir: the RL workdir (workdirs), else None.
  """

  source: str
  kind: str
  model_cfg: transformer.ModelConfig
  params: Any
  mesh: jax.sharding.Mesh
  run_cfg: config.BaseConfig
  recorded: bool
  tokenizer: str
  step: int | None = None
  workdir: str | None = None
  adapters: Any = None  # a LoRA run's adapters (params holds them merged)


def _model_config(run_cfg: config.BaseConfig, workdir: str):
  """The architecture the run trained: its init_from (an HF directory or
  another run) or model, without the run's settings (remat and the like)."""
  try:
    model_cfg = loaders.model_config(run_cfg)
  except CheckpointError:
    raise
  except ValueError as e:  # presets.get's: neither a directory nor a preset
    raise CheckpointError(
      f"{workdir}/config.json records the model {run_cfg.model!r}, which "
      "is neither a local HF directory nor a preset"
    ) from e
  return dataclasses.replace(model_cfg, **config.BaseConfig().model_settings())


def _check_memory(run_cfg, model_cfg, source: str) -> None:
  """The weights fit all the devices' memory, before any is read."""
  preflight.check_memory(
    run_cfg, model_cfg, training=False, name=f"--checkpoint={source}"
  )


def load(
  source: str,
  *,
  mesh: jax.sharding.Mesh | None = None,
  dtype: str = "",
  param_dtype: str = "",
  seed: int | None = None,
) -> Policy:
  """The policy named by `source`, on `mesh` (default: the first device).

  `source` is an RL workdir (its latest step), one of its checkpoints/<step>,
  an HF directory (an export carries its run's settings) or a preset (random
  init from `seed`). dtype / param_dtype: "" keeps the run's (float32
  without a run); seed None keeps the run's.
  """
  if not source:
    raise CheckpointError("No checkpoint given (--checkpoint)")
  kind, path, step = run_policy.locate(source)
  mesh = mesh_lib.make_mesh(1, 1, 1) if mesh is None else mesh
  overrides = {"dtype": dtype, "param_dtype": param_dtype, "seed": seed}
  overrides = {k: v for k, v in overrides.items() if v not in ("", None)}
  if kind == "workdir":
    run_cfg = run_policy.read_json(os.path.join(path, "config.json"))
    run_cfg = run_policy.recorded_config(run_cfg)
    run_cfg = dataclasses.replace(run_cfg, **overrides)
    _check_memory(run_cfg, _model_config(run_cfg, path), source)
    model_cfg, params, adapters, step = loaders.run_params(
      run_cfg, path, step, mesh
    )
    return Policy(
      source,
      kind,
      model_cfg,
      params,
      mesh,
      run_cfg,
      recorded=True,
      tokenizer=loaders.tokenizer_source(run_cfg),
      step=step,
      workdir=path,
      adapters=adapters,
    )
  info_file = os.path.join(path, EXPORT_INFO)
  raw, step = {}, None
  if kind == "hf" and os.path.exists(info_file):
    info = run_policy.read_json(info_file)
    raw, step = info.get("run_config", {}), info.get("step")
  # An exported dir is its own model (and tokenizer, if one was copied).
  run_cfg = run_policy.recorded_config(
    {**raw, "model": path, "init_from": "", "tokenizer": ""}
  )
  run_cfg = dataclasses.replace(run_cfg, **overrides)
  _check_memory(run_cfg, loaders.model_config(run_cfg), source)
  model_cfg, params = loaders.load_model(run_cfg, mesh)
  return Policy(
    source,
    kind,
    model_cfg,
    params,
    mesh,
    run_cfg,
    recorded=bool(raw),
    tokenizer=loaders.tokenizer_source(run_cfg),
    step=step,
  )


def export_hf(policy: Policy | str, out_dir: str) -> str:
  """Writes `policy` as a Hugging Face directory that transformers loads.

  config.json + safetensors (hf.save), the tokenizer's files when it is an
  HF tokenizer (the built-in char tokenizer has none: rlreason.json says so
  and loaders.load_tokenizer falls back to it), and rlreason.json with the
  source, step and the run's settings (so evaluating the export behaves as
  evaluating the workdir). A previous export at `out_dir` is replaced;
  any other non-empty directory is refused.
  """
  if isinstance(policy, str):
    policy = load(policy)
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    if not os.path.exists(os.path.join(out_dir, EXPORT_INFO)):
      raise CheckpointError(
        f"Export directory {out_dir} exists and is not an earlier export"
      )
  tok = tokenizer_lib.load(policy.tokenizer)
  special = {
    "bos_token_id": tok.bos_id,
    "eos_token_id": tok.eos_id,
    "pad_token_id": tok.pad_id,
  }
  tmp = out_dir.rstrip("/") + ".tmp"
  if jax.process_index() == 0:
    shutil.rmtree(tmp, ignore_errors=True)
  # Every process takes part in gathering the parameters, one tensor at a
  # time; process 0 writes.
  hf.save(
    tmp,
    policy.model_cfg,
    policy.params,
    extra_config={k: v for k, v in special.items() if v is not None},
  )
  if jax.process_index() == 0:
    if policy.tokenizer != "char":
      for name in sorted(os.listdir(policy.tokenizer)):
        if name.startswith("tokenizer") or name in _TOKENIZER_FILES:
          shutil.copy2(os.path.join(policy.tokenizer, name), tmp)
    info = {
      "source": policy.source,
      "kind": policy.kind,
      "step": policy.step,
      "tokenizer": (
        "char: the built-in character tokenizer (rlreason.model.tokenizer."
        "CharTokenizer); no tokenizer files are written"
        if policy.tokenizer == "char"
        else f"copied from {policy.tokenizer}"
      ),
      "run_config": dataclasses.asdict(policy.run_cfg)
      if policy.recorded
      else {},
    }
    with open(os.path.join(tmp, EXPORT_INFO), "w") as f:
      json.dump(info, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
  return out_dir


def export_peft(policy: Policy | str, out_dir: str) -> str:
  """Writes a LoRA run's adapters alone in PEFT's format
  (adapter_config.json + adapter_model.safetensors), for
  peft.PeftModel.from_pretrained on the run's base model (its HF directory:
  --model / --init_from; export_hf of the base for a preset)."""
  if isinstance(policy, str):
    policy = load(policy)
  lcfg = adapters_lib.lora_config(policy.run_cfg)
  if policy.adapters is None or lcfg is None:
    raise CheckpointError(
      f"{policy.source} is not a LoRA run (--lora_rank=0): no adapters to "
      "export; export_hf writes its weights"
    )
  base = policy.run_cfg.init_from or presets.checkpoint_dir(
    policy.run_cfg.model
  )
  config_json, tensors = hf_layout.peft_files(
    mesh_lib.to_host(policy.adapters), policy.model_cfg, lcfg, base
  )
  if jax.process_index() == 0:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
      json.dump(config_json, f, indent=2)
    safetensors.numpy.save_file(
      tensors, os.path.join(out_dir, "adapter_model.safetensors")
    )
  return out_dir
