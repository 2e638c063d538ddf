r"""Plan a run for a TPU slice (or this machine) by AOT compilation.

  python -m experiments.plan --experiment=grpo --scale=paper --topology=v5p-32
  python -m experiments.plan --experiment=dapo --scale=paper \
      --topology=v5p-128 --programs=train_step
  python -m experiments.plan --experiment=grpo --topology=local   # CPU / GPU
  python -m experiments.plan --all --families=v5p,v4

Needs libtpu for TPU slices (`pip install "jax[tpu]"`; no TPU is used: the
compiler runs on this host). Prints per-chip memory by kind, whether the
run fits with >= 15% of HBM free, the ten largest buffers, FLOPs and bytes
per step, a roofline step time and MFU, and what to change when it does not
fit. `--all` searches, for every experiment's PAPER preset and each chip
family, the smallest slice that fits (experiments/plan_all.py) and writes
results.json (resumable: finished cells are reused) and table.md;
`--merge` puts one slice's plan into them.
"""

import dataclasses
import json
import os
import sys
import time

from absl import app
from absl import flags

from rlreason.plan import aot

_ARGS = sys.argv[1:]
if not (
  "--topology=local" in _ARGS
  or any(a == "--topology" and b == "local" for a, b in zip(_ARGS, _ARGS[1:]))
):
  # TPU slices: libtpu's compiler on this host, before jax starts a backend
  # (for the local devices, whatever JAX finds: a GPU too).
  aot.tpu_env()

import jax  # noqa: E402

from rlreason import devices  # noqa: E402
from rlreason import mesh as mesh_lib  # noqa: E402
from rlreason.plan import chips  # noqa: E402
from rlreason.plan import program as program_lib  # noqa: E402
from rlreason.plan import report  # noqa: E402
from rlreason.plan import search  # noqa: E402
from rlreason.plan import summary  # noqa: E402
from rlreason.train import run_info  # noqa: E402

from experiments import plan_all  # noqa: E402
from experiments import plan_hooks  # noqa: E402


# A CPU has no published peak: the roofline's figures for one (1 TFLOP/s,
# 100 GB/s), which the report calls placeholders; experiments.bench.matmul
# measures this host's matmul peak.
LOCAL_PLACEHOLDERS = (1e12, 1e11)


def mesh_for(topology: str, cfg):
  """(mesh, hbm bytes, devices, peak FLOP/s, bandwidth, ICI bandwidth)
  of a slice, or of the local devices for topology "local" (memory from
  the device; no ICI figure: 0)."""
  if topology == "local":
    devices.no_tpu_probe_without_tpus()  # a CPU host with libtpu installed
    devs = jax.devices()
    stats = devs[0].memory_stats() or {}
    # A CPU's devices share its host's RAM (devices.total_memory).
    total = devices.total_memory()[0] or len(devs) << 40
    hbm = stats.get("bytes_limit", 0) or total // len(devs)
    peak, bw = chips.local_peaks(devs[0]) or LOCAL_PLACEHOLDERS
    ici = 0.0
  else:
    s = chips.parse(topology)
    devs = chips.devices(s)
    hbm, peak, bw = s.hbm_bytes, s.chip.peak_flops, s.chip.hbm_bandwidth
    ici = s.chip.ici_bandwidth
  mesh = mesh_lib.make_mesh(
    cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor, devices=devs
  )
  return mesh, hbm, len(devs), peak, bw, ici


def plan(
  name,
  scale,
  topology,
  overrides,
  programs,
  rollout_rows=0,
  score_rows=0,
  stop_over_fit=False,
  more_rows=True,
):
  """(Summary, seconds) of a run on a slice (`stop_over_fit`: the programs
  after one over the fit are not compiled; `more_rows`: a rollout that
  fits is tried at the rows per call the fit holds; aot.compile_run)."""
  cfg, loss_fn, extras = plan_hooks.experiment_config(name, scale, overrides)
  mesh, hbm, n_dev, peak, bw, ici = mesh_for(topology, cfg)
  t0 = time.time()
  progs = aot.compile_run(
    cfg,
    loss_fn,
    mesh,
    programs=programs,
    rollout_rows=rollout_rows,
    score_rows=score_rows,
    hbm_bytes=hbm,
    fit_bytes=int((1 - summary.FIT_MARGIN) * hbm),
    stop_over_fit=stop_over_fit,
    more_rows=more_rows,
    progress=lambda line: print(f"{name} on {topology}: {line}", flush=True),
    **extras,
  )
  train = progs.get("train_step")
  if isinstance(train, program_lib.Program):  # the micro-batches it needed
    cfg = dataclasses.replace(cfg, **train.run_flags)
  s = summary.summarize(
    progs,
    cfg,
    aot.model_config(cfg),
    hbm_bytes=hbm,
    devices=n_dev,
    peak_flops=peak,
    hbm_bandwidth=bw,
    ici_bandwidth=ici,
    decode_tokens=plan_hooks.hook(name, "decode_tokens", cfg),
    score_forwards=plan_hooks.hook(name, "score_forwards", cfg),
  )
  return s, time.time() - t0


def _row(s: summary.Summary, topology: str) -> dict:
  budget = {}  # the flags the run needs (program_lib.TEMP_BUDGETS)
  for name, flag in program_lib.TEMP_BUDGETS.items():
    mib = s.programs[name].temp_budget_mib if name in s.programs else 0
    if mib:  # a flag several programs share: the smallest of theirs
      budget[flag] = min(mib, budget.get(flag, mib))
  for p in s.programs.values():  # e.g. --rollout_rows, --rm_micro_batches
    for flag, value in p.run_flags.items():
      if value or not budget.get(flag):  # a budget another program needs
        budget[flag] = value  # beats one's --flag=0 (compile_one)
  # Which program holds the peak, and why a budget did not take (a
  # miss's notes say what the compiler refused).
  peak_of = max(s.programs, key=lambda k: s.programs[k].peak_bytes, default="")
  notes = {k: p.note[:1000] for k, p in s.programs.items() if p.note}
  return {
    "slice": topology,
    "fits": s.fits,
    "peak_gib": round(s.peak_bytes / summary.GIB, 2),
    "margin": round(s.margin, 3),
    "step_s": round(s.step_seconds, 2),
    "train_s": round(s.train_seconds, 2),
    "mfu": round(s.mfu, 3),
    "errors": s.errors,
    **budget,
    **({"unsplit": s.unsplit} if s.unsplit else {}),
    **({"peak_of": peak_of} if peak_of else {}),
    **({"notes": notes} if notes else {}),
    # Seconds per RL step of each program's collectives (ici.ici_times)
    **(
      {"ici_s": {k: round(v, 2) for k, v in s.ici_seconds.items()}}
      if s.ici_seconds
      else {}
    ),
  }


def check_flags(f, overrides: dict) -> None:
  """The experiments, slice and --set keys, before anything compiles: a
  UsageError naming the flag and what it takes."""
  known = plan_hooks.experiment_names()
  names = [n for n in f.experiments.split(",") if n] if f.all else []
  names = names or (known if f.all else [f.experiment])
  if bad := [n for n in names if n not in known]:
    raise app.UsageError(
      f"--experiment{'s' if f.all else ''}: unknown {', '.join(bad)}; "
      f"expected one of {', '.join(known)}"
    )
  if f.scale not in ("laptop", "paper"):
    raise app.UsageError(f"--scale={f.scale}: expected laptop or paper")
  if not f.all and f.topology != "local":
    try:
      chips.parse(f.topology)
    except ValueError as e:
      raise app.UsageError(f"--topology: {e} (or local)") from None
  for name in names:
    fields = plan_hooks.config_fields(name)
    if bad := sorted(set(overrides) - fields):
      raise app.UsageError(
        f"--set: {', '.join(bad)} not a field of experiments/{name}.py's "
        f"Config (its flags: python -m experiments.{name} --helpfull)"
      )


def main(argv):
  del argv
  f = flags.FLAGS
  programs = tuple(p for p in f.programs.split(",") if p)
  unknown = [p for p in programs if p not in aot.PROGRAMS]
  if unknown:
    raise app.UsageError(
      f"--programs: unknown {', '.join(unknown)}; expected some of "
      f"{', '.join(aot.PROGRAMS)}"
    )
  overrides = plan_hooks.parse_set(f.set)
  check_flags(f, overrides)
  if f.merge and (f.all or f.topology == "local"):
    raise app.UsageError("--merge takes one TPU slice's plan (--topology)")
  if f.all:
    names = tuple(n for n in f.experiments.split(",") if n)
    print(
      plan_all.plan_all(f.out, f.families.split(","), programs, f.set, names)
    )
    return
  split = {}
  if f.split_micro_batches and f.topology != "local":
    split = plan_hooks.split_overrides(
      f.experiment, f.scale, f.topology, overrides
    )
  s, secs = plan(
    f.experiment,
    f.scale,
    f.topology,
    {**overrides, **split},
    programs,
    f.rollout_rows,
    f.score_rows,
    stop_over_fit=f.stop_over_fit,
    more_rows=f.more_rows,
  )
  if f.row_out or f.merge:  # plan_all's child (slice_row); a re-plan
    # The results' own files do not make the code dirty.
    commit = run_info.current_commit(ignore=("experiments/plan_results",))
    # --set's overrides too: the run needs them (e.g. --mesh_tensor=2).
    # The planner's own flags (_row: e.g. --micro_batches a train step
    # over the fit needed) over the ones it was given.
    row = {**overrides, **split, **_row(s, f.topology), "commit": commit}
    row["host_gb"] = round(program_lib.host_peak_gb(), 1)  # the compiler's need
    if f.row_out:
      with open(f.row_out, "w") as out:
        json.dump(row, out)
    if f.merge:
      kept = search.merge_row(f.out, f.experiment, row, plan_all.unbounded_keys)
      print(
        f"--merge: {f.out} keeps {kept['slice']} with step "
        f"{kept.get('step_s')} s (alternative: {kept.get('alternative')})"
      )
  title = (
    f"{f.experiment} ({f.scale}) on {f.topology}: compiled in {secs:.0f} s"
    f" (this host's memory at its peak: {program_lib.host_peak_gb():.1f} GB)"
  )
  if split:  # the preset's micro-batch does not split over these chips
    title += f" with --micro_batches={split['micro_batches']}"
  print(report.text(s, title))
  if f.topology == "local" and not chips.local_peaks(jax.devices()[0]):
    print(
      f"  ({jax.devices()[0].device_kind}: no published peak; the roofline "
      "and MFU use placeholders of 1 TFLOP/s and 100 GB/s: compare its "
      "step time with a measured one, e.g. python -m "
      "experiments.bench.matmul for this host's matmul peak)"
    )
  sys.exit(0 if s.fits else 1)


if __name__ == "__main__":
  flags.DEFINE_string("experiment", "grpo", "experiments/<name>.py")
  flags.DEFINE_alias("method", "experiment")  # as experiments.reproduce does
  flags.DEFINE_string("scale", "paper", "laptop | paper")
  flags.DEFINE_string("topology", "v5p-32", "a TPU slice name, or local")
  flags.DEFINE_string(
    "programs",
    ",".join(aot.PROGRAMS),
    "to compile (values: a critic's forward, teacher / reward_model: a "
    "frozen model's, reward_model_train: rm_grpo's Bradley-Terry step, "
    "judge / teachers: other models' samplers, where the run has them)",
  )
  flags.DEFINE_string("set", "", "k=v,... Config overrides")
  flags.DEFINE_integer(
    "rollout_rows",
    0,
    "sequences per sampler call; 0 = --set rollout_rows, else sized from HBM",
  )
  flags.DEFINE_integer("score_rows", 0, "rows per reference forward; 0 = N")
  flags.DEFINE_bool("all", False, "plan every PAPER preset")
  flags.DEFINE_bool(
    "stop_over_fit", False, "compile nothing after a program over the fit"
  )
  flags.DEFINE_bool(
    "more_rows",
    True,
    "a rollout that fits at the rows per call its estimate sizes (which "
    "errs high) is compiled again at the rows its peak says the fit holds; "
    "a fit there is kept with --rollout_rows (one or two more compiles)",
  )
  flags.DEFINE_bool(
    "split_micro_batches",
    False,
    "where the preset's train micro-batch does not split over the slice's "
    "chips, plan it with the fewest micro-batches that do (the row records "
    "--micro_batches)",
  )
  flags.DEFINE_string("row_out", "", "write the plan's row here (json)")
  flags.DEFINE_bool(
    "merge",
    False,
    "put the plan's row into --out's tried.json and, where it is the "
    "family's cell, results.json (a re-plan of one slice, e.g. at "
    "--set=mesh_tensor=2: the faster fit is kept, with the ICI bound "
    "where only one row has it)",
  )
  flags.DEFINE_string(
    "families", ",".join(search.FAMILIES), "chip families (--all)"
  )
  flags.DEFINE_string(
    "experiments", "", "--all: these experiments, in order (default all)"
  )
  flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(__file__), "plan_results"),
    "--all writes here (results.json is versioned: the table grows over runs)",
  )
  app.run(main)
