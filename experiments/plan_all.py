"""`python -m experiments.plan --all`: every PAPER preset's smallest slice
of each chip family, by AOT compilation (experiments/plan.py plans one
slice; rlreason/plan/search.py walks the slices and writes the table).

For each experiment with a PAPER preset and each family, the search
starts where the preset's fits on other families put its total memory
(among the slices whose HBM holds the parameters and Adam moments),
steps down while a smaller slice fits and up while out of memory, until
two misses at one row per chip show the peak tending over the fit. Each
slice compiles in its own process (`slice_row`), only up to its first
program over the fit; a slice over whose chips the preset's train
micro-batch does not split is planned with the fewest micro-batches that
do (--split_micro_batches); one where the rollout would gather its
weights every decode step is planned again at --mesh_tensor=2 and 4 and
with the sampler's own split, --rollout_tensor=4 (tensor_splits), and the
fastest fit kept. results.json (resumable:
finished cells are reused), tried.json (every slice compiled) and
table.md are written as it goes.
"""

import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import jax

from experiments import plan_hooks
from rlreason import mesh as mesh_lib
from rlreason.plan import aot
from rlreason.plan import chips
from rlreason.plan import search
from rlreason.plan import state as plan_state
from rlreason.plan import summary
from rlreason.train import train_step as ts


def one_row_per_chip(name: str, s: chips.Slice, overrides=None) -> bool:
  """Whether the PAPER preset's train micro-batch (split for the slice, as
  --split_micro_batches plans it) holds at most one row per batch shard
  there: then a larger slice cannot hold fewer."""
  overrides = overrides or {}
  split = plan_hooks.split_overrides(name, "paper", s.name, overrides)
  cfg = plan_hooks.experiment_config(name, "paper", {**overrides, **split})[0]
  return ts.micro_batch_rows(cfg) <= ts.batch_shards(cfg, s.chips)


def fsdp_rollout(name: str, slice_name: str, overrides: dict) -> bool:
  """Whether the PAPER preset's rollout splits its weights over fsdp on
  the slice (the auto layout, mesh.rollout_rules: bf16 weights over 40%
  of a chip at the preset's tensor split, or the sampler's own:
  --rollout_tensor): each decode step then gathers them over the ICI."""
  cfg = plan_hooks.experiment_config(name, "paper", overrides)[0]
  if getattr(cfg, "rollout_layout", "auto") != "auto":
    return False
  model_cfg = aot.model_config(cfg)
  weights = model_cfg.num_params() * plan_state.compute_bytes(model_cfg)
  hbm = chips.parse(slice_name).hbm_bytes
  tensor = getattr(cfg, "rollout_tensor", 0) or max(cfg.mesh_tensor, 1)
  return not mesh_lib.replicates(weights, tensor, hbm)


def tensor_splits(name: str, slice_name: str, overrides: dict) -> tuple:
  """The --set texts a slice is also planned at (the fastest fit kept,
  search.faster) where the preset's rollout would gather its weights
  every decode step (fsdp_rollout): --mesh_tensor=2, and 4 where the
  model's KV heads split 4 ways and the slice has 8 chips or more, then
  the largest of those as the sampler's own split alone
  (--rollout_tensor, training as the preset splits it). A split of T
  divides by T the weights a chip holds and re-reads every decode step
  (replicated over the rest), leaving room for more rows per call; dler
  on v6e-16: 559.7 s per RL step at --mesh_tensor=2, 396.41 s at 4 (its
  train MFU 75% -> 66%); expert_iteration's 7B at 4 on v6e-8 misses in
  the train step; truncated_ppo's 32B, whose train step misses at 2 and
  4 on v5p-256, takes 1675.14 s at --rollout_tensor=8 (11380.54 s
  gathering)."""
  if (
    "mesh_tensor" in overrides
    or "rollout_tensor" in overrides
    or not fsdp_rollout(name, slice_name, overrides)
  ):
    return ()
  cfg = plan_hooks.experiment_config(name, "paper", overrides)[0]
  four = aot.model_config(cfg).n_kv_heads % 4 == 0
  splits = (2, 4) if four and chips.parse(slice_name).chips >= 8 else (2,)
  return (
    *(f"mesh_tensor={t}" for t in splits),
    f"rollout_tensor={splits[-1]}",
  )


def unbounded(results: dict) -> dict:
  """{family: [experiment, ...]} of the fits in `results` whose RL step has
  no ICI bound (no `ici_s`: planned before it) while their rollout splits
  the weights over fsdp (gathered every decode step): their step times
  are far too short until they are planned again."""
  out = {}
  for key, row in sorted(results.items()):
    name, family = key.split("/")
    if not row.get("fits") or "ici_s" in row:
      continue
    tensor = {k: row[k] for k in ("mesh_tensor", "rollout_tensor") if k in row}
    if row.get("rollout_layout") == "fsdp" or fsdp_rollout(
      name, row["slice"], tensor
    ):
      out.setdefault(family, []).append(name)
  return {f: out[f] for f in search.FAMILIES if f in out}


def unbounded_keys(results: dict) -> set:
  """unbounded(results) as results' keys ("dump/v4"): table.md marks them."""
  return {f"{n}/{f}" for f, names in unbounded(results).items() for n in names}


def unbounded_text(results: dict) -> str:
  """unbounded(results) as the README lists it: "v4 (2): a, b; v5e (1): c"."""
  return "; ".join(
    f"{f} ({len(names)}): {', '.join(names)}"
    for f, names in unbounded(results).items()
  )


def candidate_slices(name: str, family: str, overrides: dict):
  """The family's slices, from the smallest whose HBM (less the fit margin)
  holds fp32 parameters and two Adam moments (of the policy and whatever
  is trained beside it) split over all chips."""
  cfg, _, extras = plan_hooks.experiment_config(name, "paper", overrides)
  shapes = plan_state.trained_shapes(
    cfg, aot.model_config(cfg), extras.get("extra_params")
  )[0]
  state = 12 * sum(x.size for x in jax.tree.leaves(shapes))
  return [
    s
    for s in chips.sizes(family)
    if state / s.chips <= (1 - summary.FIT_MARGIN) * s.hbm_bytes
  ]


# A slice whose compiling process was killed (SIGKILL: the host's OOM
# killer; stopped by SIGINT / SIGTERM, nothing is recorded).
KILLED = (
  "the compile was killed (host out of memory? --set=scan_layers=true "
  "compiles one layer for all)"
)


def slice_row(name, slice_name, programs, set_text) -> dict:
  """One slice's row for plan_all, compiled in a child process: the TPU
  compiler took up to 22 GB of host memory for one 7B preset's programs
  (dump's v4 slices, on this 24 GiB host; in one process, cells after the
  first were killed at 20 GB), and a child killed for it is a miss, not
  the search's end."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "row.json")
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "experiments.plan",
        f"--experiment={name}",
        "--scale=paper",
        f"--topology={slice_name}",
        f"--programs={','.join(programs)}",
        f"--set={set_text}",
        "--stop_over_fit",
        "--split_micro_batches",
        f"--row_out={out}",
      ],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      capture_output=True,
      text=True,
    )
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)
  if proc.returncode in (-signal.SIGINT, -signal.SIGTERM):
    raise KeyboardInterrupt(f"{name} on {slice_name}: stopped")  # not a miss
  lines = proc.stderr.strip().splitlines() or ["no output"]
  why = KILLED if proc.returncode < 0 else lines[-1][:300]
  return {"slice": slice_name, "fits": False, "errors": {"plan": why}}


def plan_all(out_dir, families, programs, set_text="", names=()):
  """The smallest slice of each family that fits, per PAPER preset (of
  `names`, in that order; default every experiment), with the config
  overrides `set_text` (--set). Each family's search starts where the
  preset's other families' fits suggest (start_index); each slice
  compiles in its own process (slice_row), only up to its first program
  over the fit. Every slice tried is kept in tried.json, so a rerun
  resumes mid-search."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "results.json")
  tried_path = os.path.join(out_dir, "tried.json")
  results, tried = search.load(path), search.load(tried_path)
  overrides = plan_hooks.parse_set(set_text)

  for name in names or plan_hooks.experiment_names():
    if not hasattr(importlib.import_module(f"experiments.{name}"), "PAPER"):
      continue
    for family in families:
      key = f"{name}/{family}"
      if key in results:
        continue
      cell = tried.setdefault(key, {})

      def try_slice(s, key=key, name=name, cell=cell):
        if s.name not in cell:
          t0 = time.time()
          cell[s.name] = slice_row(name, s.name, programs, set_text)
          for split in tensor_splits(name, s.name, overrides):
            tp = ",".join(filter(None, (set_text, split)))
            cell[s.name] = search.faster(
              cell[s.name], slice_row(name, s.name, programs, tp)
            )
          search.save(tried, tried_path)
          row = cell[s.name]
          print(
            f"{key} {s.name}: peak {row.get('peak_gib', '-')} GiB "
            f"fits={row['fits']} {row.get('errors') or ''} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
          )
        return cell[s.name]

      slices = candidate_slices(name, family, overrides)
      known = [
        (chips.parse(r["slice"]).chips, r["peak_gib"] * summary.GIB)
        for k, r in results.items()
        if k.split("/")[0] == name and r.get("fits")
      ]
      row, names_tried = search.smallest_fit(
        slices,
        try_slice,
        search.start_index(slices, known),
        functools.partial(one_row_per_chip, name, overrides=overrides),
      )
      errors = [cell[n].get("errors", {}) for n in names_tried]
      killed = [n for n, e in zip(names_tried, errors) if KILLED in e.values()]
      if row["fits"] and killed:  # a smaller slice's verdict is unknown
        row = {**row, "killed": killed}
      results[key] = row
      search.save(results, path)
  if unbounded(results):
    print("Fits without the ICI bound (steps too short, plan them again):")
    print(unbounded_text(results), flush=True)
  return search.write_table(out_dir, results, unbounded_keys(results))
