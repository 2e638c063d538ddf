"""A claim's runs read back: per-seed metrics, the table, the curves.

experiments/reproduce.py runs every variant of a `Claim`
(experiments/claims.py) for every seed, each in its own workdir
(<root>/<method>/<variant>/seed<k>); `write_report` reads their
metrics.jsonl, eval_{before,after}.json and COMMIT and writes results.md,
curves.png and results.json under <root>/<method> (reproduce.py's
docstring). `claim` is any object with a Claim's fields (variants, metric,
extra, evals, claim, expected). `code_note` says where a reused run was
made by other code than today's (`code_files`: the files an experiment's
code is made of).
"""

import ast
import functools
import json
import os
import pathlib

import numpy as np

from rlreason import metrics as metrics_lib
from rlreason.train import report
from rlreason.train import run_info

HEAD, TAIL = 0.1, 0.25  # fractions of the steps: "start" and "end" windows


def curve(workdir: str, key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of a per-step key; the last row per step wins."""
  by_step = {}
  for row in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if "loss" in row and isinstance(row.get(key), (int, float)):
      by_step[row["step"]] = row[key]
  steps = np.array(sorted(by_step), np.int64)
  return steps, np.array([by_step[s] for s in steps], np.float64)


def _window_means(steps, values, total: int) -> tuple[float, float]:
  """Means over the first HEAD and the last TAIL fraction of `total` steps."""
  head = values[steps <= max(1, round(HEAD * total))]
  tail = values[steps > total - max(1, round(TAIL * total))]
  return tuple(
    float(np.mean(v)) if len(v) else float("nan") for v in (head, tail)
  )


def _eval(workdir: str, which: str, key: str = "eval/accuracy") -> float:
  path = os.path.join(workdir, f"eval_{which}.json")
  if not os.path.exists(path):
    return float("nan")
  with open(path) as f:
    return float(json.load(f).get(key, float("nan")))


def _eval_columns(claim) -> list[tuple[str, str, str]]:
  """(column, which, key): greedy accuracy and the claim's eval keys."""
  cols = [("held-out before", "before", "eval/accuracy")]
  cols += [(f"{k} before", "before", k) for k in claim.evals]
  cols += [("held-out after", "after", "eval/accuracy")]
  cols += [(f"{k} after", "after", k) for k in claim.evals]
  return cols


def summarize(name: str, claim, seeds, *, root: str) -> dict:
  """{variant: {column: [value per seed]}} for the table."""
  out = {}
  for label in claim.variants:
    cols = {}
    for seed in seeds:
      workdir = os.path.join(root, name, label, f"seed{seed}")
      with open(os.path.join(workdir, "config.json")) as f:
        total = json.load(f)["steps"]
      for key in (claim.metric, *claim.extra):
        head, tail = _window_means(*curve(workdir, key), total)
        cols.setdefault(key, []).append(tail)
        if key == claim.metric:
          cols.setdefault("delta", []).append(tail - head)
      for column, which, key in _eval_columns(claim):
        cols.setdefault(column, []).append(_eval(workdir, which, key))
    out[label] = cols
  return out


def _cell(values) -> str:
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  if not len(v):
    return "-"
  std = v.std(ddof=1) if len(v) > 1 else 0.0
  return f"{v.mean():.3f} ± {std:.3f} [{v.min():.3f}, {v.max():.3f}]"


def plot(name: str, claim, seeds, *, root: str, path: str) -> None:
  """One panel per metric: each variant's mean over seeds (band: min..max)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = (claim.metric, *claim.extra)
  fig, axes = plt.subplots(
    1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False
  )
  for ax, key in zip(axes[0], keys):
    for i, label in enumerate(claim.variants):
      curves = [
        curve(os.path.join(root, name, label, f"seed{s}"), key) for s in seeds
      ]
      common = sorted(set.intersection(*(set(c[0].tolist()) for c in curves)))
      if not common:
        continue
      ys = np.stack([v[np.isin(s, common)] for s, v in curves])
      w = max(1, len(common) // 15)
      mean = report._smooth(ys.mean(0), w)
      ax.plot(common, mean, color=f"C{i}", lw=2, label=label)
      if len(seeds) > 1:
        lo, hi = report._smooth(ys.min(0), w), report._smooth(ys.max(0), w)
        ax.fill_between(common, lo, hi, color=f"C{i}", alpha=0.15)
    ax.set_title(key)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  fig.suptitle(f"{name}: mean over seeds {','.join(map(str, seeds))}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# The repository's root: code_changes' paths are relative to it.
REPO = pathlib.Path(__file__).resolve().parents[2]
_PACKAGES = ("rlreason", "experiments")


@functools.cache  # read once per module and process
def code_files(module: str) -> frozenset[str]:
  """The files (paths from REPO) of `module` ("experiments.dapo") and of
  every rlreason / experiments module and package it imports, at any
  depth, anywhere in a file: read from the sources, not imported."""
  found, todo = set(), [module]
  while todo:
    name = todo.pop()
    parts = name.split(".")
    todo += [".".join(parts[:k]) for k in range(1, len(parts))]  # packages
    base = REPO.joinpath(*parts)
    path = next(
      (
        p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()
      ),
      None,
    )
    if path is None or str(path.relative_to(REPO)) in found:
      continue
    found.add(str(path.relative_to(REPO)))
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        if node.module.split(".")[0] in _PACKAGES:
          todo += [node.module] + [
            f"{node.module}.{a.name}" for a in node.names
          ]
      elif isinstance(node, ast.Import):
        todo += [
          a.name for a in node.names if a.name.split(".")[0] in _PACKAGES
        ]
  return frozenset(found)


def code_note(workdir: str, module: str) -> str:
  """What a reused run's code was, where it may not be today's (config.json
  cannot tell a change of code without a field from none): "" when none
  of the files of `module`'s code (code_files) differ from its COMMIT."""
  made = run_info.commit_of(workdir)
  if made is None:
    return " (no COMMIT file: the code that made it is unknown)"
  if made == run_info.current_commit() and not made.endswith("-dirty"):
    return ""  # today's commit (also in a tree shipped without .git)
  changed = run_info.code_changes(made)
  if changed is None:
    return f" (made at {made[:12]}; git cannot tell what changed since)"
  mine = code_files(module)
  changed = [f for f in changed if f in mine]
  if not changed and not made.endswith("-dirty"):
    return ""
  said = f"made at {made[:12]}"
  if made.endswith("-dirty"):
    said += " with uncommitted changes, not recorded"
  if changed:
    files = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
    said += f"; {len(changed)} of its code files differ from it now: {files}"
  return f" ({said}; delete it or pass another --root to rerun on this code)"


def commits(name: str, claim, seeds, *, root: str) -> dict[str, list[str]]:
  """{commit: ["variant/seed<k>", ...]}: the code each run was made by (its
  COMMIT file; "unknown" without one), first-seen order."""
  out = {}
  for label in claim.variants:
    for seed in seeds:
      workdir = os.path.join(root, name, label, f"seed{seed}")
      made = run_info.commit_of(workdir) or "unknown"
      out.setdefault(made, []).append(f"{label}/seed{seed}")
  return out


def _code_line(made: dict[str, list[str]]) -> str:
  if len(made) == 1:
    return f"Code: every run made at commit {next(iter(made))}."
  return f"Code: the runs were made at {len(made)} commits: " + "; ".join(
    f"{c} ({', '.join(runs)})" for c, runs in made.items()
  )


def write_report(name: str, claim, seeds, *, root: str, command: str) -> str:
  """results.md, results.json and curves.png under root/name; `command`
  is the command line that made the runs (every flag that changes them)."""
  table = summarize(name, claim, seeds, root=root)
  outdir = os.path.join(root, name)
  plot(name, claim, seeds, root=root, path=os.path.join(outdir, "curves.png"))
  made = commits(name, claim, seeds, root=root)
  with open(os.path.join(outdir, "results.json"), "w") as f:
    json.dump(
      {"seeds": list(seeds), "variants": table, "commits": made}, f, indent=2
    )
  columns = [
    claim.metric,
    "delta",
    *claim.extra,
    *(column for column, _, _ in _eval_columns(claim)),
  ]
  lines = [
    f"# Mini-reproduction: {name}",
    "",
    f"Claim: {claim.claim}",
    "",
    f"Expected: {claim.expected}.",
    "",
    f"Command: `{command}`",
    "",
    _code_line(made),
    "",
    f"Per-step metrics are means over the last {TAIL:.0%} of the steps; "
    f"delta is that minus the mean over the first {HEAD:.0%} (growth "
    "during training). Held-out: accuracy before / after RL, greedy (the "
    "mean over the samples where a variant sets --eval_samples > 1). Cells: "
    "mean ± std [min, max] over seeds.",
    "",
    "| variant | " + " | ".join(columns) + " |",
    "|---" * (len(columns) + 1) + "|",
  ]
  for label, cols in table.items():
    cells = [_cell(cols.get(c, [])) for c in columns]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines += ["", "![curves](curves.png)", ""]
  path = os.path.join(outdir, "results.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path
