"""The slice search of `plan --all` and its table, on rows a planner wrote.

  row, tried = search.smallest_fit(slices, try_slice, start, steady)
  table = search.markdown(results, search.FAMILIES)
  text = search.tables(results)  # table.md: that, and one per family

A row is one slice's verdict as experiments/plan.py records it (slice,
fits, peak_gib, step_s, train_s, mfu, errors and the flags the run needs).
`smallest_fit` walks a family's slices (smallest first) with a
`try_slice(slice)` that compiles one (experiments/plan_all.py: a child
process per slice) or, in tests, fakes it; `start_index` picks where to
start from other families' fits; `faster` keeps one of two rows of a slice
and `merge_row` puts one slice's row into the results' files. Nothing here
compiles.
"""

import json
import os

from rlreason.plan import chart
from rlreason.plan import chips
from rlreason.plan import program as program_lib
from rlreason.plan import summary


FAMILIES = ("v4", "v5p", "v5e", "v6e")  # the table's columns
# The flags a row records (the run needs them): set by the planner.
ROW_FLAGS = tuple(
  dict.fromkeys(  # each once, in this order
    (
      "micro_batches",
      *program_lib.TEMP_BUDGETS.values(),
      "rollout_rows",
      "rollout_layout",
      "rm_micro_batches",
      "mesh_tensor",  # through --set
      "rollout_tensor",  # through --set
      "sequence_parallel",  # through --set
      "scan_layers",  # through --set
      "remat_policy",  # through --set
    )
  )
)


def run_flag(name: str, value) -> str:
  """A row's flag as the run takes it: `--name=value`; a boolean as
  `--name` / `--noname` (absl's form)."""
  if isinstance(value, bool):
    return f"--{name}" if value else f"--no{name}"
  return f"--{name}={value}"


def start_index(slices, known) -> int:
  """Where to start the search in `slices` (a family's, smallest first):
  the smallest whose HBM, less the fit margin, summed over its chips holds
  the least total memory a fitting slice of another family used (`known`:
  (chips, per-chip peak bytes) pairs); 0 when nothing is known."""
  if not known:
    return 0
  need = min(chips * peak for chips, peak in known)
  for i, s in enumerate(slices):
    if s.chips * (1 - summary.FIT_MARGIN) * s.hbm_bytes >= need:
      return i
  return len(slices) - 1


def peak_floor(small, big) -> float:
  """Where the per-chip peak tends as the slice grows, from two slices'
  (chips, peak): the model peak = a + b / chips (the train state and
  whatever is split over all chips fall as 1 / chips; what each chip
  holds whatever the slice, one row's activations once a micro-batch is
  one row per chip, stays), so the floor is a."""
  (n1, p1), (n2, p2) = small, big
  b = (p1 - p2) / (1 / n1 - 1 / n2)
  return p2 - b / n2


def train_step_only(row) -> bool:
  """Whether a miss's peak is its train step's: compiled first, and over
  the fit it stops the slice (the other programs have no time)."""
  return row.get("peak_gib", 0) > 0 and row["step_s"] == row["train_s"]


def smallest_fit(slices, try_slice, start: int = 0, steady=None):
  """(row, names tried): the smallest of `slices` (smallest first) whose
  `try_slice(slice)` row fits, searching from `start`: down while the next
  smaller one fits, else up while a larger one may help (the misses are
  out of memory, not errors a larger slice keeps). A miss at a start above
  the smallest slice tries the one below it first: the TPU scheduler can
  make a larger slice hold more per chip than a smaller one (igpo: v6e-16
  missed at 33.39 GiB where v6e-8 fits at 23.72). Without a fit, the last
  row tried.

  `steady(slice)`: whether the train step's rows per chip cannot fall on
  that slice or larger ones (one row per chip). Two such misses whose
  train-step peaks tend (peak_floor) over the fit stop the search: no
  larger slice fits; the row says the floor (floor_gib)."""
  tried = []

  def attempt(i):
    tried.append(slices[i].name)
    return try_slice(slices[i])

  i = start
  row = attempt(i)
  if not row["fits"] and i > 0 and summary.misses_by_memory(row):
    below = attempt(i - 1)
    if below["fits"]:
      row, i = below, i - 1
  if row["fits"]:
    while i > 0:
      smaller = attempt(i - 1)
      if not smaller["fits"]:
        break
      row, i = smaller, i - 1
    return row, tried
  while summary.misses_by_memory(row) and i + 1 < len(slices):
    i += 1
    miss, row = row, attempt(i)
    if row["fits"]:
      break
    if (
      steady
      and all(map(train_step_only, (miss, row)))
      and steady(slices[i - 1])
      and steady(slices[i])
    ):
      floor = peak_floor(
        (slices[i - 1].chips, miss["peak_gib"]),
        (slices[i].chips, row["peak_gib"]),
      )
      if floor * summary.GIB > (1 - summary.FIT_MARGIN) * slices[i].hbm_bytes:
        return {**row, "floor_gib": round(floor, 2)}, tried
    if not summary.misses_by_memory(row):
      # A larger slice that cannot run it at all (its batch does not split
      # over the chips, say): the answer is the miss below it.
      error = next(iter(row["errors"].values()))
      return {**miss, "beyond": {"slice": row["slice"], "error": error}}, tried
  return row, tried


# A fit whose step is known to be far too short: planned before the ICI
# bound while its rollout gathers the weights every decode step
# (experiments/plan_all.py's `unbounded` names them).
UNBOUNDED = "no ICI bound: too short"


def markdown(results: dict, families, unbounded=()) -> str:
  """The table of `results`' cells; the keys in `unbounded` marked."""
  lines = [
    "| experiment | " + " | ".join(families) + " |",
    "|---|" + "---|" * len(families),
  ]
  names = sorted({k.split("/")[0] for k in results})
  for name in names:
    cells = []
    for family in families:
      r = results.get(f"{name}/{family}")
      if not r:
        cells.append("-")
      elif not summary.misses_by_memory(r):
        error = next(iter(r["errors"].values()))
        cells.append(f"not planned: {error[:60]}")
      elif not r.get("fits"):
        beyond = ""
        if r.get("beyond"):  # a sharding error's point is after "implies"
          why = r["beyond"]["error"].split(" implies that ")[-1][:70]
          beyond = f" ({r['beyond']['slice']}: {why})"
        floor = ""
        if r.get("floor_gib"):
          floor = (
            f" (one row per chip: the peak tends to {r['floor_gib']} GiB,"
            " over the fit)"
          )
        cells.append(f"no fit up to {r['slice']}{beyond}{floor}")
      else:
        needed = " ".join(
          run_flag(name, r[name]) for name in ROW_FLAGS if name in r
        )
        cells.append(
          f"{r['slice']}: {r['peak_gib']} GiB, step {r['step_s']} s"
          + (f" ({UNBOUNDED})" if f"{name}/{family}" in unbounded else "")
          + f", MFU {100 * r['mfu']:.0f}%"
          + (f" ({needed})" if needed else "")
          + (
            f" ({', '.join(r['killed'])}: compile killed, not decided)"
            if r.get("killed")
            else ""
          )
          + (f" ({r['unsplit']})" if r.get("unsplit") else "")
        )
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def faster(first: dict, second: dict) -> dict:
  """Of two rows of one slice, the fit (both: the shorter RL step, or the
  one with the ICI bound when only one has it: a row without `ici_s` was
  planned before the bound, its step too short where its rollout gathers
  weights; both misses: the first), with the other's verdict as its
  `alternative` (and its commit and ICI seconds), the verdicts either
  was kept against before inside it: a slice planned several ways
  (plan_all.tensor_splits) keeps them all."""
  keep, other = first, second
  if (
    second["fits"]
    and first["fits"]
    and ("ici_s" in first) != ("ici_s" in second)
  ):
    if "ici_s" in second:
      keep, other = second, first
  elif second["fits"] and (
    not first["fits"] or second["step_s"] < first["step_s"]
  ):
    keep, other = second, first
  seen = (
    "fits", "peak_gib", "step_s", "mesh_tensor", "rollout_tensor", "errors",
    "ici_s", "commit",
  )  # fmt: skip
  alternative = {k: other[k] for k in seen if k in other}
  before = keep.get("alternative") or other.get("alternative")
  if before:
    alternative["alternative"] = before
  return {**keep, "alternative": alternative}


def load(path) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def save(obj, path) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)


def family_tables(results: dict, families, unbounded=()) -> str:
  """One table per family, of the presets planned for it (the README's)."""
  parts = []
  for family in families:
    planned = {k: r for k, r in results.items() if k.endswith(f"/{family}")}
    gib = chips.CHIPS[family].hbm_bytes / chips.GIB
    parts.append(f"{family} ({gib:.0f} GiB per chip):\n")
    parts.append(markdown(planned, (family,), unbounded))
  return "\n".join(parts)


def tables(results: dict, unbounded=()) -> str:
  """table.md: every family's cells in one table, then one table per
  family as the README shows them."""
  return (
    markdown(results, FAMILIES, unbounded)
    + "\n"
    + family_tables(results, FAMILIES, unbounded)
  )


def write_table(out_dir, results, unbounded=()) -> str:
  """table.md of every family's cells, however many the run searched, and
  their picture (slices.png, chart.plot)."""
  table = tables(results, unbounded)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(table)
  chart.plot(results, os.path.join(out_dir, "slices.png"), FAMILIES)
  return table


def merge_row(out_dir, name, row, unbounded=lambda results: ()) -> dict:
  """Puts one slice's plan (experiments/plan.py's --merge) into
  out_dir's tried.json at its slice, as `faster` keeps it against the row
  there, and into results.json where it is the family's cell (that slice
  again, or a fit on a smaller one: the table's cell is the smallest
  fit); the table again (`unbounded(results)`: the keys its cells mark).
  The kept row."""
  paths = [os.path.join(out_dir, f) for f in ("results.json", "tried.json")]
  results, tried = map(load, paths)
  key = f"{name}/{chips.parse(row['slice']).name.split('-')[0]}"
  cell = tried.setdefault(key, {})
  if row["slice"] in cell:
    row = faster(cell[row["slice"]], row)
  cell[row["slice"]] = row
  now = results.get(key)
  if now is None or (
    row["fits"]
    and (
      not now["fits"]
      or chips.parse(row["slice"]).chips < chips.parse(now["slice"]).chips
    )
  ):
    results[key] = row  # the search's notes on the slices beyond go
  elif now["slice"] == row["slice"]:
    search_notes = ("killed", "beyond", "floor_gib")
    results[key] = {**row, **{k: now[k] for k in search_notes if k in now}}
  for p, obj in zip(paths, (results, tried)):
    save(obj, p)
  write_table(out_dir, results, unbounded(results))
  return row
