r"""Score a checkpoint on a task or dataset and write a table.

  python -m experiments.evaluate --checkpoint=workdirs/grpo
  python -m experiments.evaluate --checkpoint=workdirs/grpo/checkpoints/60 \
      --data=task:arithmetic:difficulty=2 --samples=8 --ks=1,4,8
  python -m experiments.evaluate --checkpoint=/ckpt/Qwen2.5-Math-1.5B \
      --data=/data/math500.jsonl --template=boxed --max_new_tokens=2048 \
      --samples=16 --dtype=bfloat16 --out=/runs/eval/q15_math500
  python -m experiments.evaluate --checkpoint=workdirs/grpo \
      --export_hf=workdirs/grpo/hf --evaluate=false

--checkpoint is an RL workdir (its latest checkpoint), one of its
checkpoints/<step>, a Hugging Face directory, or a preset name (random init).
A workdir's model, tokenizer, template, lengths and seed are the ones its
config.json records, and without --data it is scored on the held-out data
the run evaluated on; flags left at "" / 0 / -1 keep those values.

Ctrl-C or SIGTERM stops it after the sampler call under way (exit 75;
over several hosts a signal to any one stops them all); Ctrl-C again, or
SIGKILL, stops it at once. Either way it loses at most the chunk under way
(--sequences_per_call sequences): each finished chunk's problems are kept
in <out>/partial/ (a gs:// --out: workdirs/eval/partial/gs/... here), and the
same command again starts after them (its samples are the ones an
uninterrupted run draws). partial/ goes once the files are written. Over
several hosts (--multihost or RLREASON_MULTIHOST=1, one process per host,
as launch/tpu.sh runs it) process 0 prints, writes and keeps the journal,
and shares it with the others on a rerun.

--checkpoint may name a workdir on gs:// (a TPU run's): it is read there,
and the files go to workdirs/eval/<run>/step_<N> here unless --out says
(a local directory or a gs:// one).

Writes to --out (default <workdir>/eval/step_<N>, or workdirs/eval/<name>):
eval.md (the table, also printed), eval.json (settings + every metric with
its 95% interval), samples.jsonl (per problem: prompt, gold answer,
completions, extracted answers, correct) and, with more than one k,
at_k.png (pass@k / maj@k / mean@k against k). --export_hf=DIR also writes the
params as an HF directory (config.json + safetensors, the tokenizer files
when the run used an HF tokenizer; the "tiny" preset's tokenizer is the
built-in character tokenizer, which has none); for a LoRA run (--lora_rank)
those are the merged weights, and --export_peft=DIR writes the adapters
alone in PEFT's format. Compiled programs are kept where the run kept its
own (--compile_cache: '' = the run's, <its cache_dir>/xla by default), so
scoring again, or another of its checkpoints, loads them.
"""

import dataclasses
import os
import shutil
import sys
import traceback

import jax
from absl import app
from absl import flags
from absl import logging
from etils import epath

from rlreason import config
from rlreason import devices
from rlreason import metrics as metrics_lib
from rlreason import storage
from rlreason.data import sources as data_lib
from rlreason.eval import evaluate as evaluate_lib
from rlreason.train import preemption
from rlreason.train import flags as rr_flags
from rlreason.train import preflight
from rlreason.train import run_info
from rlreason import mesh as mesh_lib
from rlreason.eval import trained


def _field(default, help_text):
  return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class Config:
  """Flags of the evaluate entry point; "" / 0 / -1 = the run's value."""

  checkpoint: str = _field(
    "", "RL workdir, workdir/checkpoints/<step>, HF directory or preset"
  )
  data: str = _field("", "data spec; '' = the run's held-out data")
  split: str = _field("eval", "split to load (task eval splits are held out)")
  num_problems: int = _field(
    -1, "first N; 0 = all, -1 = a task --data's n= or the run's eval_size"
  )
  samples: int = _field(1, "samples per problem; 1 = greedy only")
  ks: str = _field("", "comma-separated k for pass@k etc; '' = 1,2,4..n")
  temperature: float = _field(1.0, "sampling temperature (samples > 1)")
  greedy: bool = _field(True, "also decode greedily when samples > 1")
  out: str = _field(
    "", "output directory (local or gs://); '' = <workdir>/eval/step_<N>"
  )
  write_samples: bool = _field(True, "keep every completion in samples.jsonl")
  export_hf: str = _field("", "also write the params as an HF directory")
  export_peft: str = _field(
    "", "a LoRA run: also write its adapters alone in PEFT's format"
  )
  evaluate: bool = _field(True, "score the checkpoint (false: export only)")
  template: str = _field("", "prompt template; '' = the run's (plain)")
  tokenizer: str = _field("", "'' = the run's (char for presets)")
  max_prompt_len: int = _field(0, "0 = the run's")
  max_new_tokens: int = _field(0, "0 = the run's")
  seed: int = _field(-1, "eval key and preset init; -1 = the run's (0)")
  dtype: str = _field("", "compute dtype; '' = the run's (float32)")
  param_dtype: str = _field("", "'' = the run's (float32)")
  sequences_per_call: int = _field(
    0, "rows per sampler call; 0 = the run's B * G"
  )
  mesh_data: int = _field(1, "mesh axis sizes, as in training")
  mesh_fsdp: int = _field(-1, "-1 = all remaining devices")
  mesh_tensor: int = _field(1, "tensor-parallel axis size")
  compile_cache: str = _field(
    "", "compiled programs kept: '' = the run's (<its cache_dir>/xla), off, DIR"
  )
  multihost: bool = _field(
    False,
    "jax.distributed.initialize(), one process per host (also "
    "RLREASON_MULTIHOST=1); process 0 writes",
  )


def _ks(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(k) for k in text.split(",") if k.strip())
  except ValueError:
    raise config.ConfigError(
      f"--ks={text!r}: expected integers like 1,4,8"
    ) from None


def check(cfg: Config) -> None:
  """The data and sampling flags, before any checkpoint is read."""
  if problem := preflight.bucket_problem("out", cfg.out):
    raise config.ConfigError(problem)
  if cfg.data:
    data_lib.check(cfg.data)
  if cfg.samples < 1:
    raise config.ConfigError(f"--samples={cfg.samples} must be >= 1")
  if cfg.template and cfg.template not in config.TEMPLATES:
    raise config.ConfigError(
      f"--template={cfg.template!r}; expected '' (the run's) or one of "
      f"{config.TEMPLATES}"
    )
  for name, least in (
    ("num_problems", -1),
    ("max_prompt_len", 0),
    ("max_new_tokens", 0),
    ("sequences_per_call", 0),
    ("temperature", 0),
  ):
    if getattr(cfg, name) < least:
      raise config.ConfigError(
        f"--{name}={getattr(cfg, name)} must be >= {least}"
      )
  bad = [k for k in _ks(cfg.ks) if not 1 <= k <= cfg.samples]
  if bad:
    raise config.ConfigError(
      f"--ks={cfg.ks}: each k must be in 1..--samples={cfg.samples} "
      f"(got {bad}); pass@k needs k samples per problem"
    )


def default_out(policy: trained.Policy) -> str:
  """<workdir>/eval/step_<N> for a local workdir; workdirs/eval/<name>
  (/step_<N>) for a preset, an HF directory or a gs:// workdir (--out
  names a gs:// directory)."""
  step = f"step_{policy.step}"
  if policy.workdir is not None and storage.is_local(policy.workdir):
    return os.path.join(policy.workdir, "eval", step)
  name = os.path.basename(os.path.normpath(policy.workdir or policy.source))
  parts = (name, step) if policy.workdir is not None else (name,)
  return os.path.join("workdirs", "eval", *parts)


def journal_for(out_dir: str) -> str:
  """Where an interrupted evaluation keeps its finished problems: on local
  disk always (it is appended to, row by row), <out>/partial for a local
  --out, workdirs/eval/partial/<gs/bucket/...> for a remote one."""
  if storage.is_local(out_dir):
    return os.path.join(out_dir, "partial")
  return os.path.join(
    "workdirs", "eval", "partial", out_dir.replace("://", "/")
  )


def _evaluate(cfg: Config, policy, journal_dir: str, interrupt):
  """evaluate_lib.evaluate with the flags' settings."""
  return evaluate_lib.evaluate(
    policy,
    data=cfg.data,
    split=cfg.split,
    num_problems=None if cfg.num_problems < 0 else cfg.num_problems,
    samples=cfg.samples,
    temperature=cfg.temperature,
    ks=_ks(cfg.ks),
    greedy=cfg.greedy,
    sequences_per_call=cfg.sequences_per_call,
    template=cfg.template or None,
    tokenizer=cfg.tokenizer or None,
    max_prompt_len=cfg.max_prompt_len or None,
    max_new_tokens=cfg.max_new_tokens or None,
    journal_dir=journal_dir,
    interrupt=interrupt,
  )


def run(cfg: Config) -> dict:
  """Loads, optionally exports, evaluates and writes; returns the results."""
  check(cfg)
  run_info.maybe_initialize_distributed(cfg)
  is_main = jax.process_index() == 0  # the one that prints and writes
  preflight.check_mesh(cfg)  # the --mesh_* flags split the devices there are
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  policy = trained.load(
    cfg.checkpoint,
    mesh=mesh,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    seed=None if cfg.seed < 0 else cfg.seed,
  )
  run_info.use_compile_cache(
    dataclasses.replace(
      policy.run_cfg,
      compile_cache=cfg.compile_cache or policy.run_cfg.compile_cache,
    )
  )  # Where the run keeps its programs: a rerun loads what compiled.
  where = f" step {policy.step}" if policy.step is not None else ""
  if is_main:
    print(f"Loaded {policy.kind} {cfg.checkpoint}{where}", flush=True)
  out = {"policy": policy}
  if cfg.export_hf:  # every process takes part; process 0 writes
    out["export_hf"] = trained.export_hf(policy, cfg.export_hf)
    if is_main:
      print(f"Exported HF checkpoint to {cfg.export_hf}", flush=True)
  if cfg.export_peft:
    out["export_peft"] = trained.export_peft(policy, cfg.export_peft)
    if is_main:
      print(f"Exported the LoRA adapter to {cfg.export_peft}", flush=True)
  if not cfg.evaluate:
    return out
  out_dir = cfg.out or default_out(policy)
  journal_dir = journal_for(out_dir)  # an interrupted run's
  with (
    preemption.Preemption(  # after jax.distributed's handler
      stopping="stopping after the sampler call under way, keeping the "
      "finished problems"
    ) as preempt,
    metrics_lib.compile_lines(is_main),  # the sampler: minutes at scale
  ):
    try:
      report = _evaluate(cfg, policy, journal_dir, preempt.interrupt)
    except preemption.Interrupted:
      if is_main:
        print(
          f"Stopped: the finished problems are kept ({journal_dir}); the "
          f"same command resumes after them (exit code "
          f"{rr_flags.EXIT_STOPPED}).",
          file=sys.stderr,
          flush=True,
        )
      return {**out, "stopped": True, "out": out_dir}
  paths = {}
  if is_main:
    paths = evaluate_lib.write(report, out_dir, samples_jsonl=cfg.write_samples)
    shutil.rmtree(journal_dir, ignore_errors=True)  # the files hold it all
    print(epath.Path(paths["md"]).read_text(), flush=True)
    print(f"Wrote {', '.join(paths.values())}", flush=True)
  return {**out, "report": report, "out": out_dir, "files": paths}


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  values = flags.FLAGS
  cfg = Config(
    **{f.name: values[f.name].value for f in dataclasses.fields(Config)}
  )
  try:
    if run(cfg).get("stopped"):
      sys.exit(rr_flags.EXIT_STOPPED)
  except (trained.CheckpointError, data_lib.DataError, config.ConfigError) as e:
    # A bad flag, path or spec, before any compute: the message says which
    # (exit 2, as an experiment's usage errors: train/flags.py).
    print(f"error: {e}", file=sys.stderr)
    sys.exit(rr_flags.EXIT_USAGE)
  except KeyboardInterrupt:
    print(
      "Interrupted: the finished problems are kept (<out>/partial/); the "
      "same command resumes after them.",
      file=sys.stderr,
    )
    sys.exit(130)
  except jax.errors.JaxRuntimeError as e:
    if not devices.out_of_memory(str(e)):
      raise
    traceback.print_exc()
    turn = (
      "--sequences_per_call (fewer sequences per sampler call), "
      "--dtype=bfloat16 --param_dtype=bfloat16, --mesh_* (more devices), a "
      "smaller --max_new_tokens. The same command resumes after the "
      "finished problems (<out>/partial/)."
    )
    sys.exit(rr_flags.out_of_memory_line(e, turn))


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  rr_flags.define_from_dataclass(Config)  # Only here: imports define none.
  app.run(_main)
