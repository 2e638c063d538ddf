"""A trained policy from wherever it lives, and its export to Hugging Face.

  policy = trained.load("workdirs/grpo")              # latest checkpoint
  policy = trained.load("workdirs/grpo/checkpoints/40")
  policy = trained.load("/ckpt/Qwen2.5-Math-1.5B")    # HF directory
  policy = trained.load("tiny")                       # preset, random init
  trained.export_hf(policy, "out/hf")  # config.json + safetensors

An RL workdir's params come from its orbax checkpoint (params only; the
optimizer state is not read). Its architecture, tokenizer, template, lengths
and seed come from the config.json the run recorded (run_info.write_run_info),
so evaluating a workdir (rlreason/eval/evaluate.py) reproduces the loop's own
evaluation. An exported directory carries those settings in rlreason.json.
Paths are local.
"""

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp
import safetensors.numpy
from etils import epath

from rlreason import config
from rlreason import storage
from rlreason.train import adapters as adapters_lib
from rlreason.train import loaders
from rlreason.train import preflight
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


def _base_config(raw: dict) -> config.BaseConfig:
  names = {f.name for f in dataclasses.fields(config.BaseConfig)}
  return config.BaseConfig(**{k: v for k, v in raw.items() if k in names})


def _read_json(path: str) -> dict:
  try:
    return json.loads(epath.Path(path).read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: cannot read ({e})") from None


def _path(source: str) -> epath.Path:
  """`source` as a path: local ones absolute, gs:// ones as they are (a
  run's workdir on GCS is read through etils.epath, its checkpoints
  through orbax)."""
  return epath.Path(
    os.path.abspath(source) if storage.is_local(source) else source
  )


def _tokenizer_source(cfg: config.BaseConfig) -> str:
  """As loaders.load_tokenizer, but also looks past a warm-start init_from."""
  if cfg.tokenizer:
    return cfg.tokenizer
  for src in (cfg.init_from, presets.checkpoint_dir(cfg.model)):
    if src and os.path.exists(os.path.join(src, "tokenizer_config.json")):
      return src
  return "char"


def _locate(source: str) -> tuple[str, str, int | None]:
  """(kind, path, step): what `source` names, or a CheckpointError. An RL
  workdir (or one of its checkpoints) may be on gs://; an HF directory
  is local."""
  path = source.rstrip("/") or source
  here = _path(path)
  if not here.is_dir():
    if source.lower() in presets.PRESETS:
      return "preset", source, None
    parent = here.parent
    if parent.name == "checkpoints" and parent.is_dir():
      steps = sorted(int(d.name) for d in parent.iterdir() if d.name.isdigit())
      raise CheckpointError(
        f"Checkpoint {source}: no such step; saved steps: {steps}"
      )
    raise CheckpointError(
      f"Checkpoint {source!r}: no such directory, and not a model preset "
      f"({', '.join(sorted(presets.PRESETS))})"
    )
  parent = here.parent
  if here.name.isdigit() and parent.name == "checkpoints":
    return "workdir", os.fspath(parent.parent), int(here.name)
  if here.name == "checkpoints":
    return "workdir", os.fspath(parent), None
  cfg_file = os.path.join(path, "config.json")
  if (here / "checkpoints").is_dir():
    return "workdir", path, None
  if not storage.is_local(path):
    raise CheckpointError(
      f"Checkpoint {path}: not an RL workdir (no checkpoints/); a Hugging "
      "Face directory must be local"
    )
  if not os.path.exists(cfg_file):
    raise CheckpointError(
      f"Checkpoint {path}: neither an RL workdir (no checkpoints/) nor a "
      "Hugging Face directory (no config.json)"
    )
  if "class" in _read_json(cfg_file):  # run_info.write_run_info's marker
    raise CheckpointError(
      f"RL workdir {path} has no checkpoints ({path}/checkpoints is "
      "missing); the run stopped before its first save"
    )
  return "hf", path, None


def _model_config(run_cfg: config.BaseConfig, workdir: str):
  """The architecture the run trained: its init_from or model."""
  tried = []
  for src in (run_cfg.init_from, presets.checkpoint_dir(run_cfg.model)):
    if not src:
      continue
    if os.path.isdir(src):
      return hf.config_from_hf(
        hf.read_config(src),
        source=os.path.join(src, "config.json"),
        dtype=run_cfg.param_dtype,
        compute_dtype=run_cfg.dtype,
      )
    if src.lower() in presets.PRESETS:
      return presets.get(
        src, dtype=run_cfg.dtype, param_dtype=run_cfg.param_dtype
      )
    tried.append(src)
  raise CheckpointError(
    f"{workdir}/config.json records the model {' / '.join(tried)!r}, which "
    "is neither a local HF directory nor a preset"
  )


def restore_params(
  workdir: str, model_cfg, mesh, step: int | None = None, like=None, axes=None
):
  """(params, step) from the run's orbax checkpoint (latest by default);
  `like` / `axes`: the params' shapes and logical axes when they are not
  the model's (a LoRA run's adapters)."""
  directory = os.fspath(_path(workdir) / "checkpoints")
  if not epath.Path(directory).is_dir():
    raise CheckpointError(f"RL workdir {workdir}: {directory} is missing")
  manager = ocp.CheckpointManager(
    directory,
    options=ocp.CheckpointManagerOptions(create=False),
    item_names=("state", "meta"),
  )
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      raise CheckpointError(
        f"RL workdir {workdir}: no checkpoints in {directory}"
      )
    step = steps[-1] if step is None else step
    if step not in steps:
      raise CheckpointError(
        f"{directory}/{step}: no such checkpoint; saved steps: {steps}"
      )
    shapes = transformer.param_shapes(model_cfg) if like is None else like
    axes = transformer.param_axes(model_cfg) if axes is None else axes
    shardings = mesh_lib.shardings(mesh, axes, mesh_lib.TRAIN_RULES, shapes)
    item = {
      "params": jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes,
        shardings,
      )
    }
    try:
      out = manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
            item=item,
            restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True,  # the params only, not the optimizer
          )
        ),
      )
    except (ValueError, KeyError) as e:
      raise CheckpointError(
        f"{directory}/{step}: params do not match the model recorded in "
        f"{workdir}/config.json: {e}"
      ) from e
  finally:
    manager.close()
  return out.state["params"], step


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
  kind, path, step = _locate(source)
  mesh = mesh_lib.make_mesh(1, 1, 1) if mesh is None else mesh
  overrides = {"dtype": dtype, "param_dtype": param_dtype, "seed": seed}
  overrides = {k: v for k, v in overrides.items() if v not in ("", None)}
  if kind == "workdir":
    run_cfg = _read_json(os.path.join(path, "config.json"))
    run_cfg = dataclasses.replace(_base_config(run_cfg), **overrides)
    model_cfg = _model_config(run_cfg, path)
    _check_memory(run_cfg, model_cfg, source)
    adapters = None
    if lcfg := adapters_lib.lora_config(run_cfg):
      # The base the run started from, and its adapters, merged.
      model_cfg, base = loaders.load_model(run_cfg, mesh)
      adapted, fresh = adapters_lib.prepare(
        run_cfg, model_cfg, base, mesh, lcfg
      )
      adapters, step = restore_params(
        path, model_cfg, mesh, step, like=fresh, axes=adapted.axes
      )
      params = adapted.policy(adapters)
    else:
      params, step = restore_params(path, model_cfg, mesh, step)
    return Policy(
      source,
      kind,
      model_cfg,
      params,
      mesh,
      run_cfg,
      recorded=True,
      tokenizer=_tokenizer_source(run_cfg),
      step=step,
      workdir=path,
      adapters=adapters,
    )
  info_file = os.path.join(path, EXPORT_INFO)
  raw, step = {}, None
  if kind == "hf" and os.path.exists(info_file):
    info = _read_json(info_file)
    raw, step = info.get("run_config", {}), info.get("step")
  # An exported dir is its own model (and tokenizer, if one was copied).
  run_cfg = _base_config(
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
    tokenizer=_tokenizer_source(run_cfg),
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
