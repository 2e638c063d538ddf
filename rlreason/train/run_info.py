"""A run's identity on disk and in the cluster.

  run_info.maybe_initialize_distributed(cfg)   # jax.distributed, if asked
  run_info.use_compile_cache(cfg)              # --compile_cache
  workdir = run_info.workdir_for(cfg, "grpo")
  run_info.write_run_info(workdir, cfg)        # config.json + COMMIT
  run_info.differences(saved, cfg)             # vs a saved config.json
  run_info.code_changes(run_info.commit_of(workdir))  # code since a run

status.json (STATUS) is written by the loop when `train` returns.
RESUMABLE_CHANGES are the fields a resume may change without
--allow_config_change (preflight.check_resume).
"""

import contextlib
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys

import jax
from etils import epath
from jax.experimental.compilation_cache import compilation_cache

from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason import storage
from rlreason.sampling import journal as journal_lib
from rlreason.sampling import scoring


_HERE = os.path.dirname(os.path.abspath(__file__))

# Fields a resumed run may change without --allow_config_change. None of
# them changes what the run computes (up to numerics): how long it goes on
# and what it records; how the rollout is batched and laid out (samples
# draw per-row keys); how the updates fit the devices (what an
# out-of-memory error says to turn before a rerun resumes, and a run moved
# to another slice). A test keeps every name a BaseConfig field.
RESUMABLE_CHANGES = tuple(
  "steps workdir log_every eval_every checkpoint_every keep_checkpoints "
  "stop_after_hours "
  "async_checkpoint tensorboard wandb_project cache_dir compile_cache "
  "multihost validate_rows allow_config_change "
  "rollout_rows rollout_batching decode_attention rollout_layout "
  "rollout_tensor sequence_parallel scan_layers "
  "micro_batches remat remat_policy train_temp_budget_mib "
  "rollout_temp_budget_mib score_temp_budget_mib "
  "mesh_data mesh_fsdp mesh_tensor".split()
)


def differences(saved: dict, cfg, ignore=()) -> list[str]:
  """Fields in which a saved config.json (a dict) differs from `cfg`.

  A field added to the Config after the run was made counts as unchanged if
  `cfg` has the default it was introduced with (in the most basic Config
  that has it: the behaviour of the code before it existed), not a
  subclass's (e.g. a method that turns a new base option on), unless a
  class's `absent_means` names the value that gives the behaviour of
  before (a field introduced with a default that changed it). "class" is
  compared too: `module.Class` as the loop saves it.
  """
  want = dataclasses.asdict(cfg)
  defaults = {}
  for klass in type(cfg).__mro__[::-1]:
    if dataclasses.is_dataclass(klass):
      for f in dataclasses.fields(klass):
        defaults.setdefault(f.name, f.default)
      defaults.update(vars(klass).get("absent_means", {}))
  diff = [
    k for k in want if k not in ignore and saved.get(k, defaults[k]) != want[k]
  ]
  if not same_class(saved.get("class", class_name(cfg)), class_name(cfg)):
    diff.append("class")
  return sorted(diff)


def same_class(a: str, b: str) -> bool:
  """Whether two recorded class names are one class: an experiment run as
  `python -m experiments.grpo` records `__main__.Config`, imported it
  records `experiments.grpo.Config`."""
  if a == b:
    return True
  (ma, _, ca), (mb, _, cb) = a.rpartition("."), b.rpartition(".")
  return ca == cb and "__main__" in (ma, mb)


def class_name(cfg) -> str:
  """`module.Class` of a config, as config.json records it: the module's
  import name also where it runs as the program (`python -m
  experiments.grpo` records experiments.grpo.Config; records made before
  this say __main__.Config, which same_class matches)."""
  module = type(cfg).__module__
  if module == "__main__":
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = getattr(spec, "name", None) or module
  return f"{module}.{type(cfg).__name__}"


# status.json: {"status": "finished" | "stopped", "step", "steps"}, written
# when train returns; absent while a run is going on (or was killed).
STATUS = "status.json"


def write_status(
  workdir: str, stopped: bool | None, step: int = 0, steps: int = 0
) -> None:
  """status.json: stopped (True) or finished (False) at `step` of `steps`;
  None removes it (the run is going on)."""
  path = epath.Path(workdir) / STATUS
  if stopped is None:
    path.unlink(missing_ok=True)
  else:
    status = "stopped" if stopped else "finished"
    storage.write_json(path, {"status": status, "step": step, "steps": steps})


def finished_eval(workdir: str, steps: int, scope: dict) -> dict | None:
  """The last evaluation (eval_after.json) of the run in `workdir` if it
  finished at step `steps` and scored the same problems (`scope`), else
  None: a rerun of a finished run's command reuses it instead of scoring
  the same weights again. Read before the run marks itself running;
  process 0 reads, every process gets its answer (mesh.from_process_0)."""
  saved = None
  if jax.process_index() == 0:
    status = storage.read_json(epath.Path(workdir) / STATUS) or {}
    after = storage.read_json(epath.Path(workdir) / "eval_after.json") or {}
    if (
      status.get("status") == "finished"
      and status.get("step") == steps
      and after
      and all(after.get(k) == v for k, v in scope.items())
    ):
      saved = after
  return mesh_lib.from_process_0(saved)


def evaluation_missing(workdir: str, cfg, step: int) -> bool:
  """Whether --eval_every schedules an evaluation at `step` (before the
  last) that the run's metrics.jsonl lacks: a resumed run whose evaluation
  there was stopped (or never began) does it first. Process 0 reads the
  file; every process gets its answer."""
  due = cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps
  return bool(due) and not _evaluated(workdir, step)


def _evaluated(workdir: str, step: int) -> bool:
  found = None
  if jax.process_index() == 0:
    path = epath.Path(workdir) / "metrics.jsonl"
    found = path.exists() and any(
      row.get("step") == step and "eval/accuracy" in row
      for row in metrics_lib.read_jsonl(path)
    )
  return bool(mesh_lib.from_process_0(found))


def _partial(workdir: str, cfg, name: str) -> str:
  """<workdir>/<name>, or on local disk (<cache_dir>/<name>/<bucket path>)
  for a gs:// workdir: where unfinished work is kept (the journals)."""
  if storage.is_local(workdir):
    return os.path.join(workdir, name)
  return os.path.join(cfg.cache_dir, name, workdir.replace("://", "/"))


def _resume_setting(cfg) -> dict:
  """The settings a resume may not change (RESUMABLE_CHANGES
  aside): what names a journal."""
  return {
    k: v
    for k, v in dataclasses.asdict(cfg).items()
    if k not in RESUMABLE_CHANGES
  }


def eval_journal(workdir: str, cfg, step: int) -> str:
  """The journal of the run's evaluation at `step` (scoring.journal_path):
  in <workdir>/eval_partial/ (_partial), named by the step and every
  setting a resume may not change."""
  directory = _partial(workdir, cfg, "eval_partial")
  return scoring.journal_path(directory, f"step_{step}", _resume_setting(cfg))


def rollout_journal(workdir: str, cfg, step: int) -> str:
  """Where step `step`'s policy rollouts keep their finished rows
  (rollout.generate's journal): <workdir>/rollout_partial/step_<step>-
  <digest of the settings a resume may not change>/ (_partial), one
  subdirectory per rollout, named by what else its samples depend on.
  The policy of a run's first step is its checkpoint's (or the initial
  one): only that step's journal is kept at a resume
  (clear_rollout_journals)."""
  digest = journal_lib.setting_digest(_resume_setting(cfg))
  partial = _partial(workdir, cfg, "rollout_partial")
  return os.path.join(partial, f"step_{step}-{digest}")


def clear_rollout_journals(workdir: str, cfg, start: int) -> None:
  """Deletes the rollout journals but `start`'s (a run starting at step
  `start`): any other step's rows came from weights the run does not
  have (a step before the checkpoint, or one a killed run reached past
  it). Process 0, which alone writes them."""
  keep = rollout_journal(workdir, cfg, start)
  partial = os.path.dirname(keep)
  if jax.process_index() == 0 and os.path.isdir(partial):
    for name in os.listdir(partial):
      if os.path.join(partial, name) != keep:
        shutil.rmtree(os.path.join(partial, name), ignore_errors=True)


def remove_rollout_journal(directory: str) -> None:
  """Deletes a step's rollout journals, and rollout_partial/ once empty
  (process 0, which alone writes them)."""
  if jax.process_index() == 0:
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):  # another step's is in it
      os.rmdir(os.path.dirname(directory))


def remove_journal(path: str) -> None:
  """Deletes an evaluation's journal, and its directory once empty."""
  pathlib.Path(path).unlink(missing_ok=True)
  with contextlib.suppress(OSError):  # another journal is in it
    os.rmdir(os.path.dirname(path))


def maybe_initialize_distributed(cfg) -> None:
  """jax.distributed.initialize() for --multihost or RLREASON_MULTIHOST=1.

  Coordinator address, process count and id come from the environment
  (TPU VMs and SLURM are detected by JAX itself; otherwise set
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
  RLREASON_DISTRIBUTED_TIMEOUT (seconds) bounds the wait for the others.

  Every process then runs the same host-side code on the same global batch
  (prompts, rewards, advantages: cheap next to the model) and places only
  the shards its own devices hold (mesh.put_global); device results come
  back gathered (mesh.to_host). All processes take part in checkpoints;
  only process 0 writes logs, metrics and reports. A run matches the
  single-process run on the same mesh (tests/multihost_test.py).
  """
  if not (cfg.multihost or os.environ.get("RLREASON_MULTIHOST") == "1"):
    return
  if jax.distributed.is_initialized():
    return
  kwargs = {}
  if "JAX_COORDINATOR_ADDRESS" in os.environ:
    kwargs = dict(
      coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
      process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
  if "RLREASON_DISTRIBUTED_TIMEOUT" in os.environ:
    kwargs["initialization_timeout"] = int(
      os.environ["RLREASON_DISTRIBUTED_TIMEOUT"]
    )
  if (
    jax.config.jax_platforms in (None, "", "cpu")
    or os.environ.get("JAX_PLATFORMS") == "cpu"
  ):
    # CPU-only processes need a collectives backend for cross-process ops.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)


def compile_cache_dir(cfg, environ=os.environ) -> str:
  """Where --compile_cache keeps the run's compiled programs ("" = off)."""
  if cfg.compile_cache == "off":
    return ""
  if cfg.compile_cache != "auto":
    path = cfg.compile_cache
  else:
    path = environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
      cfg.cache_dir, "xla"
    )
  return path if "://" in path else os.path.abspath(path)


def use_compile_cache(cfg) -> str:
  """Points JAX's persistent compilation cache at compile_cache_dir(cfg)
  before the run compiles anything, or turns it off; returns it. A process
  that already compiled under another setting (a notebook's second run)
  takes this one."""
  path = compile_cache_dir(cfg)
  unchanged = jax.config.jax_enable_compilation_cache == bool(path) and (
    not path or path == jax.config.jax_compilation_cache_dir
  )
  if not unchanged:
    jax.config.update("jax_enable_compilation_cache", bool(path))
    if path:
      compilation_cache.set_cache_dir(path)
    compilation_cache.reset_cache()  # read the setting again at next compile
  return path


def workdir_for(cfg, name: str) -> str:
  return cfg.workdir or os.path.join("workdirs", name)


def current_commit(ignore: tuple[str, ...] = ()) -> str:
  """HEAD's hash (+ "-dirty" with uncommitted changes outside `ignore`,
  paths from the repository's root); in a tree shipped without .git
  (launch/tpu.sh sync), its COMMIT file; else "unknown"."""
  try:
    commit = subprocess.run(
      ["git", "rev-parse", "HEAD"],
      capture_output=True,
      text=True,
      cwd=_HERE,
      timeout=10,
      check=True,
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--", ":/"]
      + [f":(top,exclude){p}" for p in ignore],
      capture_output=True,
      text=True,
      cwd=_HERE,
      timeout=10,
    ).stdout
    return commit + ("-dirty" if dirty.strip() else "")
  except (OSError, subprocess.SubprocessError):
    root = os.path.dirname(os.path.dirname(_HERE))  # rlreason/train -> repo
    shipped = os.path.join(root, "COMMIT")
    if os.path.exists(shipped):
      with open(shipped) as f:
        return f.read().strip() or "unknown"
    return "unknown"


def commit_of(workdir: str) -> str | None:
  """The COMMIT a run's workdir records (write_run_info), or None."""
  path = os.path.join(workdir, "COMMIT")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read().strip() or None


def code_changes(
  commit: str,
  paths: tuple[str, ...] = ("rlreason", "experiments"),
  repo: str | None = None,
) -> list[str] | None:
  """The .py files under `paths` (from the root of the repository holding
  `repo`, default this package) in which the working tree differs from
  `commit` (a COMMIT file's; "-dirty" dropped: the uncommitted part is not
  recorded); None where git cannot tell (no repository, a commit it does
  not have)."""
  specs = [f":(top,glob){p}/**/*.py" for p in paths]
  try:
    out = subprocess.run(
      ["git", "diff", "--name-only", commit.removesuffix("-dirty"), "--"]
      + specs,
      capture_output=True,
      text=True,
      cwd=repo or _HERE,
      timeout=30,
      check=True,
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return out.split()


def write_run_info(workdir: str, cfg) -> None:
  """config.json (resolved) and COMMIT, so any result traces back.

  `workdir` may be a local path or a gs:// URL (etils.epath).
  """
  workdir = epath.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  storage.write_json(
    workdir / "config.json",
    {
      "class": class_name(cfg),
      **dataclasses.asdict(cfg),
    },
  )
  commit = current_commit()
  (workdir / "COMMIT").write_text(commit + "\n")
