r"""Laptop-scale mini-reproductions of each method's central claim.

  python -m experiments.reproduce --method=dr_grpo --seeds=0,1,2 [--steps=N]
      [--testbed=base|tiny] [--variants=a,b]

runs every variant of the method's `Claim` for every seed, each in its own
workdir (<root>/<method>/<variant>/seed<k>, root workdirs/reproduce/<testbed>),
then writes (rlreason/eval/reproduction.py)

  <root>/<method>/results.md    table: the claim's metric per variant,
                                mean +- std [min, max] over seeds
  <root>/<method>/curves.png    the metrics over RL steps, mean over seeds
                                (band: min..max)
  <root>/<method>/results.json  the per-seed numbers

Testbeds. `base` (the default): the shipped pretrained base, as the main job
(grpo.Config's settings where they differ from grpo.TinyConfig, without its
in-run evals), then the experiment's `BASE` dict where its tiny values do not
carry over (dler's token limit, laser's targets, ttrl's prompts, the
hard level 3 of entropy_advantage, pope, seele and ampo, dump's and adacl's
mixture of the base's addsub5 levels, kdrl's and ampo's teacher SFT steps:
claims.py's BASE_* dicts), then the claim's variant overrides (or its
`base` ones). So an
experiment's own data becomes the main job's unless its BASE says otherwise;
claims whose experiments need a task, format or warm start the base never
saw (igpo, search_r1, toolrl, logic_rl, format_length, simplerl_zoo: their
`testbeds`) run only on `tiny`, and --testbed=base names that before any
run. `tiny`: the experiments' laptop defaults on the 0.4M-parameter model
with a warm start, where the claims were first run (experiments/README.md's
older rows).

Rerunning the command reuses finished runs and resumes unfinished ones from
their checkpoints (each run is an ordinary experiment workdir). The warm
start is cached per seed (workdirs/cache), so variants share it. A run
another claim already made (same experiment, config and seed: plain grpo is
the control of many claims) is linked, not repeated. A reused run made by
other code than today's says so (its COMMIT, and the files of its
experiment's code, the modules it imports at any depth, that differ from
it now): a change of code without a new field leaves its config.json the
same. results.md names the commits that made its runs. Compiled programs
are cached under workdirs/reproduce/.jax_cache (shared by the testbeds).

Adding a claim: one `CLAIMS` entry per method in experiments/claims.py,
naming experiment modules (experiments/<module>.py) and Config overrides per
variant, and the per-step metric of metrics.jsonl that carries the claim.
--set applies overrides to every variant (e.g. --set=batch_size=8,eval_size=50;
a string value may hold commas: --set=data=task:addsub5:difficulty=3,n=200).
--variants=a,b runs and reports those arms alone (a costly arm left out, one
rerun), in the claim's order; the command in results.md records it.
"""

import dataclasses
import glob
import hashlib
import importlib
import json
import os
import sys
from typing import Sequence

import jax
from absl import app
from absl import flags
from absl import logging

from experiments.claims import CLAIMS
from experiments.claims import Claim
from rlreason import devices
from rlreason.model import presets
from rlreason.train import checkpoint
from rlreason.train import flags as rr_flags
from rlreason.train import run_info
from rlreason.eval import reproduction

# ----------------------------------------------------------------------------
# Running.


TESTBEDS = ("base", "tiny")


def testbed(module, name: str = "base"):
  """The config an experiment's claim runs start from on a testbed.

  base: its Config with the main job's settings (base_fields), then its
  `BASE` dict. tiny: its Config, or the module's `TESTBED` where it has one
  (grpo: its Config is the main job, the other experiments build on
  `grpo.TinyConfig`).
  """
  if name == "tiny":
    return getattr(module, "TESTBED", module.Config)()
  if name != "base":
    raise ValueError(f"--testbed={name!r}; one of {', '.join(TESTBEDS)}")
  fields = {**base_fields(), **getattr(module, "BASE", {})}
  return dataclasses.replace(module.Config(), **fields)


def base_fields() -> dict:
  """The shipped-base testbed's settings: the main job's (grpo.Config)
  where they differ from the tiny testbed's (grpo.TinyConfig), without its
  in-run evals and checkpoints (a claim reads eval_before / eval_after)."""
  from experiments import grpo

  main, tiny = grpo.Config(), grpo.TinyConfig()
  out = {
    f.name: getattr(main, f.name)
    for f in dataclasses.fields(main)
    if getattr(main, f.name) != getattr(tiny, f.name)
  }
  out.update(eval_every=0, checkpoint_every=tiny.checkpoint_every)
  return out


def _config(
  module_name: str,
  overrides: dict,
  seed: int,
  steps: int,
  testbed_name: str = "base",
  **kw,
):
  module = importlib.import_module(f"experiments.{module_name}")
  cfg = dataclasses.replace(
    testbed(module, testbed_name), **overrides, **kw, seed=seed
  )
  if steps:
    cfg = dataclasses.replace(cfg, steps=steps)
  # An experiment whose run() rewrites its config first (dars: --variant
  # presets) exposes that as resolve(cfg): config.json holds its result.
  resolve = getattr(module, "resolve", None)
  return module, resolve(cfg) if resolve else cfg


# Keys that may differ between a run and its reuse: init_from is replaced by
# the warm-start directory, steps may grow, workdir names the directory.
_SAME_RUN_IGNORES = ("init_from", "steps", "workdir")


def _differences(saved: dict, cfg) -> list[str]:
  """Config keys in which a saved config.json differs from cfg."""
  return run_info.differences(saved, cfg, ignore=_SAME_RUN_IGNORES)


def _finished(cfg) -> bool:
  """Whether cfg.workdir holds this run, finished; errors on a clash."""
  path = os.path.join(cfg.workdir, "config.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    saved = json.load(f)
  diff = _differences(saved, cfg)
  if diff or saved["steps"] > cfg.steps:
    diff = diff or ["steps"]
    want = {**dataclasses.asdict(cfg), "class": run_info.class_name(cfg)}
    raise ValueError(
      f"{cfg.workdir} holds a run with a different config ("
      + ", ".join(f"{k}: {saved.get(k)!r} != {want[k]!r}" for k in diff)
      + "); delete it or pass another --root"
    )
  done = os.path.exists(os.path.join(cfg.workdir, "eval_after.json"))
  return done and saved["steps"] == cfg.steps


class Interrupted(RuntimeError):
  """A run returned unfinished: the reproduction stops there."""


def _twin(cfg, root: str) -> str | None:
  """A finished run of the same experiment and config under another claim.

  Baselines recur across claims (plain grpo is the control of many), so a
  run already made for one claim is linked, not repeated, for the next.
  """
  pattern = os.path.join(root, "*", "*", f"seed{cfg.seed}", "config.json")
  for path in sorted(glob.glob(pattern)):
    workdir = os.path.dirname(path)
    if os.path.islink(workdir):  # link to the original, never to a link
      continue
    with open(path) as f:
      saved = json.load(f)
    if (
      not _differences(saved, cfg)
      and saved["steps"] == cfg.steps
      and os.path.exists(os.path.join(workdir, "eval_after.json"))
    ):
      return workdir
  return None


def _check_weights(cfg, root: str) -> None:
  """Refuses a root whose runs started from other weights of the same name.

  A shipped checkpoint (`--model=laptop-base`) keeps its name when a new
  version ships, so config.json cannot tell its runs apart: root/
  WEIGHTS.json records each shipped model's weights digest at first use.
  """
  path = presets.checkpoint_dir(cfg.model)
  weights = os.path.join(path, "model.safetensors")
  if path == cfg.model or not os.path.exists(weights):
    return
  with open(weights, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:16]
  record = os.path.join(root, "WEIGHTS.json")
  seen = {}
  if os.path.exists(record):
    with open(record) as f:
      seen = json.load(f)
  if seen.get(cfg.model, digest) != digest:
    raise ValueError(
      f"{root} holds runs from other {cfg.model} weights (sha256 "
      f"{seen[cfg.model]}, now {digest}): move it aside or pass another "
      "--root"
    )
  if cfg.model not in seen:
    os.makedirs(root, exist_ok=True)
    with open(record, "w") as f:
      json.dump({**seen, cfg.model: digest}, f, indent=1)


def select_variants(name: str, claim: Claim, variants: Sequence[str]) -> Claim:
  """The claim with only the arms labelled `variants` (all for ()), in its
  own order; ValueError names a label it does not have."""
  if unknown := [v for v in variants if v not in claim.variants]:
    raise ValueError(
      f"--variants: {', '.join(map(repr, unknown))} not among {name}'s "
      f"arms: {', '.join(claim.variants)}"
    )
  if not variants:
    return claim
  kept = {k: v for k, v in claim.variants.items() if k in variants}
  return dataclasses.replace(claim, variants=kept)


def run_all(
  name: str,
  claim: Claim,
  seeds: Sequence[int],
  *,
  steps: int = 0,
  root: str | None = None,
  common: dict | None = None,
  testbed_name: str = "base",
  variants: Sequence[str] = (),
) -> str:
  """Runs (or reuses) every variant x seed, then writes the report.

  Args:
    name: the method (directory name).
    claim: what to run and measure.
    seeds: one run per seed and variant.
    steps: RL steps of every run; 0 = each experiment's default.
    root: runs go to root/name/<variant>/seed<k>; default
      workdirs/reproduce/<testbed_name>.
    common: Config overrides for every run (applied after the variant's).
    testbed_name: one of TESTBEDS.
    variants: the labels to run and report, in the claim's order; () =
      all (a costly arm left out, one arm rerun).

  Returns:
    The path of results.md.

  Raises:
    ValueError: a label of `variants` the claim does not have.
  """
  claim = select_variants(name, claim, variants)
  root = root or os.path.join("workdirs", "reproduce", testbed_name)
  for seed in seeds:  # Seed-major: the variants share the seed's warm start.
    for label in claim.variants:
      module_name, overrides = claim.overrides(label, testbed_name)
      workdir = os.path.join(root, name, label, f"seed{seed}")
      module, cfg = _config(
        module_name,
        {**overrides, **(common or {})},
        seed,
        steps,
        testbed_name,
        workdir=workdir,
      )
      _check_weights(cfg, root)
      if not os.path.exists(workdir) and (twin := _twin(cfg, root)):
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        os.symlink(os.path.relpath(twin, os.path.dirname(workdir)), workdir)
        print(f"[reproduce] {label} seed {seed}: same run as {twin}, linked")
      if _finished(cfg):
        note = reproduction.code_note(workdir, module.__name__)
        print(f"[reproduce] {label} seed {seed}: reusing {workdir}{note}")
        continue
      print(f"[reproduce] {label} seed {seed}: running {workdir}", flush=True)
      module.run(cfg)
      if not _finished(cfg):  # SIGTERM or Ctrl-C: checkpointed, returned
        raise Interrupted(
          f"{workdir} stopped before step {cfg.steps} (SIGTERM or Ctrl-C); no "
          "report written"  # main adds: rerun the same command to resume
        )
  command = [
    f"--method={name}",
    f"--seeds={','.join(map(str, seeds))}",
    f"--testbed={testbed_name}",
  ]
  if variants:
    command.append(f"--variants={','.join(claim.variants)}")
  if steps:
    command.append(f"--steps={steps}")
  if common:
    command.append("--set=" + ",".join(f"{k}={v}" for k, v in common.items()))
  if root != os.path.join("workdirs", "reproduce", testbed_name):
    command.append(f"--root={root}")
  return reproduction.write_report(
    name,
    claim,
    seeds,
    root=root,
    command="python -m experiments.reproduce " + " ".join(command),
  )


# ----------------------------------------------------------------------------
# Command line.


def parse_overrides(text: str, module_names: Sequence[str]) -> dict:
  """'k=v,k2=v2' -> typed overrides (types from the experiments' Configs)."""
  if not text:
    return {}
  fields = {}
  for m in module_names:
    cls = importlib.import_module(f"experiments.{m}").Config
    fields.update({f.name: type(f.default) for f in dataclasses.fields(cls)})
  items = []
  for item in text.split(","):
    key, _, value = item.partition("=")
    if key in fields:
      items.append([key, value])
    elif items and fields[items[-1][0]] is str:
      items[-1][1] += "," + item  # a string value with commas (data specs)
    else:
      raise ValueError(f"--set: no Config field {key!r}")
  out = {}
  for key, value in items:
    kind = fields[key]
    if kind is bool:
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      try:
        out[key] = kind(value)
      except ValueError:
        raise ValueError(
          f"--set: {key}={value!r} is not of type {kind.__name__}"
        ) from None
  return out


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  if f.method not in CLAIMS:
    raise app.UsageError(
      f"--method={f.method!r}; registered: {', '.join(sorted(CLAIMS))}"
    )
  claim = CLAIMS[f.method]
  try:  # a claim the shipped base cannot run: before any run starts
    claim.check_testbed(f.testbed)
  except ValueError as e:
    raise app.UsageError(f"--method={f.method}: {e}") from None
  modules = [m for m, _ in claim.variants.values()]
  try:  # the flags, before any run starts
    seeds = [int(s) for s in f.seeds.split(",") if s]
  except ValueError:
    raise app.UsageError(
      f"--seeds={f.seeds!r}: expected integers like 0,1,2"
    ) from None
  try:
    common = parse_overrides(f.set, modules)
  except ValueError as e:  # names the --set item
    raise app.UsageError(str(e)) from None
  variants = [v for v in f.variants.split(",") if v]
  try:
    select_variants(f.method, claim, variants)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  # Every run compiles the same sampler / train-step / eval programs: keep
  # them on disk across runs, methods and testbeds.
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update(
      "jax_compilation_cache_dir",
      os.path.join("workdirs", "reproduce", ".jax_cache"),
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  try:
    path = run_all(
      f.method,
      claim,
      seeds,
      steps=f.steps,
      root=f.root or None,
      common=common,
      testbed_name=f.testbed,
      variants=variants,
    )
  except (Interrupted, checkpoint.Stopped) as e:
    print(f"[reproduce] {e}; rerun the same command to resume", file=sys.stderr)
    sys.exit(rr_flags.EXIT_STOPPED)
  print(path)


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  flags.DEFINE_string("method", None, "a CLAIMS key", required=True)
  flags.DEFINE_alias("experiment", "method")  # as experiments.plan names it
  flags.DEFINE_string("seeds", "0,1,2", "comma-separated seeds")
  flags.DEFINE_integer("steps", 0, "RL steps per run; 0 = each default")
  flags.DEFINE_enum("testbed", "base", TESTBEDS, "base | tiny (docstring)")
  flags.DEFINE_string(
    "root", "", "where runs go; default workdirs/reproduce/<testbed>"
  )
  flags.DEFINE_string("set", "", "k=v,... Config overrides for every run")
  flags.DEFINE_string(
    "variants", "", "comma-separated arms to run and report; default all"
  )
  logging.set_verbosity(logging.WARNING)
  app.run(main)
