"""An RL run's policy read back from its workdir: what a path names, the
run's recorded config and its checkpointed params.

  kind, path, step = run_policy.locate("workdirs/grpo/checkpoints/40")
  raw = run_policy.read_json(path + "/config.json")   # as the run recorded it
  run_cfg = run_policy.recorded_config(raw)          # its BaseConfig fields
  params, step = run_policy.restore_params(path, model_cfg, mesh, step)

A workdir's params come from its orbax checkpoint (params only; the
optimizer state is not read). The evaluation (eval/trained.py: --checkpoint)
and a run started from another's policy (--init_from, loaders.py) read runs
this way. Workdirs may be on gs://; Hugging Face directories are local.
"""

import dataclasses
import json
import os

import jax
import orbax.checkpoint as ocp
from etils import epath

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason import storage
from rlreason.model import hf
from rlreason.model import presets
from rlreason.model import transformer

CheckpointError = hf.CheckpointError


def recorded_config(raw: dict) -> config.BaseConfig:
  """A recorded config.json (a dict) as BaseConfig: its fields, the
  experiment's own dropped."""
  names = {f.name for f in dataclasses.fields(config.BaseConfig)}
  return config.BaseConfig(**{k: v for k, v in raw.items() if k in names})


def read_json(path: str) -> dict:
  try:
    return json.loads(epath.Path(path).read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: cannot read ({e})") from None


def as_path(source: str) -> epath.Path:
  """`source` as a path: local ones absolute, gs:// ones as they are (a
  run's workdir on GCS is read through etils.epath, its checkpoints
  through orbax)."""
  return epath.Path(
    os.path.abspath(source) if storage.is_local(source) else source
  )


def locate(source: str) -> tuple[str, str, int | None]:
  """(kind, path, step): what `source` names, or a CheckpointError. An RL
  workdir (or one of its checkpoints) may be on gs://; an HF directory
  is local; a shipped checkpoint's name (presets.SHIPPED: laptop-base) is
  its directory."""
  path = presets.checkpoint_dir(source.rstrip("/") or source)
  here = as_path(path)
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
      f"Checkpoint {source!r}: no such directory, not a shipped checkpoint "
      f"({', '.join(sorted(presets.SHIPPED))}) and not a model preset "
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
  if "class" in read_json(cfg_file):  # run_info.write_run_info's marker
    raise CheckpointError(
      f"RL workdir {path} has no checkpoints ({path}/checkpoints is "
      "missing); the run stopped before its first save"
    )
  return "hf", path, None


def _manager(directory: str) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
    directory,
    options=ocp.CheckpointManagerOptions(create=False),
    item_names=("state", "meta"),
  )


def saved_step(workdir: str, step: int | None = None) -> int:
  """The checkpoint of the run to read: `step`, or its latest; a
  CheckpointError naming the saved steps where that is not there."""
  directory = os.fspath(as_path(workdir) / "checkpoints")
  if not epath.Path(directory).is_dir():
    raise CheckpointError(f"RL workdir {workdir}: {directory} is missing")
  manager = _manager(directory)
  try:
    steps = sorted(manager.all_steps())
  finally:
    manager.close()
  if not steps:
    raise CheckpointError(
      f"RL workdir {workdir}: no checkpoints in {directory}"
    )
  step = steps[-1] if step is None else step
  if step not in steps:
    raise CheckpointError(
      f"{directory}/{step}: no such checkpoint; saved steps: {steps}"
    )
  return step


def restore_params(
  workdir: str, model_cfg, mesh, step: int | None = None, like=None, axes=None
):
  """(params, step) from the run's orbax checkpoint (latest by default);
  `like` / `axes`: the params' shapes and logical axes when they are not
  the model's (a LoRA run's adapters)."""
  step = saved_step(workdir, step)
  directory = os.fspath(as_path(workdir) / "checkpoints")
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
  manager = _manager(directory)
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
