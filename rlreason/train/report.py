"""A run's report: report.md with before/after evaluation and PNG curves.

Reads only the workdir (metrics.jsonl, eval_before.json, eval_after.json,
config.json, COMMIT, status.json), so it can be rerun on any finished or
running run, in a local or a gs:// workdir (rlreason/storage.py):

  python -m rlreason.train.report workdirs/grpo
"""

import os
import sys

import numpy as np
from etils import epath

from rlreason import metrics as metrics_lib
from rlreason import storage
from rlreason.model import presets

CURVES = (
  ("reward", "Reward"),
  ("accuracy", "Accuracy"),
  ("length", "Response length (tokens)"),
  ("entropy", "Entropy"),
)


def _init(cfg: dict) -> str:
  """Where the run's parameters came from, as context.py loads them."""
  if cfg.get("init_from"):
    return f"init from `{cfg['init_from']}`"
  model = str(cfg.get("model") or "")
  if model in presets.PRESETS:
    return "random init"
  return "its weights"


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
  if len(y) < window or window <= 1:
    return y
  kernel = np.ones(window) / window
  head = np.cumsum(y[: window - 1]) / np.arange(1, window)
  return np.concatenate([head, np.convolve(y, kernel, mode="valid")])


def plot_curves(
  rows: list[dict],
  path: epath.PathLike,
  title: str = "",
  eval_label: str = "held-out (eval)",
) -> list[str]:
  """A 2x2 grid of the CURVES over steps (raw + moving average), with the
  evaluations' accuracy beside the training accuracy."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train = [r for r in rows if "reward" in r]
  evals = [r for r in rows if "eval/accuracy" in r]
  fig, axes = plt.subplots(2, 2, figsize=(10, 7))
  drawn = []
  for ax, (key, label) in zip(axes.flat, CURVES):
    pts = [
      (r["step"], r[key]) for r in train if isinstance(r.get(key), (int, float))
    ]
    if pts:
      x, y = map(np.asarray, zip(*pts))
      ax.plot(x, y, color="C0", alpha=0.3, lw=1)
      ax.plot(
        x,
        _smooth(y, max(1, len(y) // 15)),
        color="C0",
        lw=2,
        label="train (moving avg)",
      )
      drawn.append(key)
    if key == "accuracy" and evals:
      ex = [r["step"] for r in evals]
      ey = [r["eval/accuracy"] for r in evals]
      ax.plot(ex, ey, "o-", color="C3", lw=2, label=eval_label)
    ax.set_title(label)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)
  return drawn


def last_row_per_step(rows: list[dict]) -> list[dict]:
  """Train rows and eval rows, one of each kind per step (the last logged):
  a workdir written before resumes cut metrics.jsonl back may repeat steps.
  """
  latest = {}
  for r in rows:
    latest[(r.get("step"), "reward" in r, "eval/accuracy" in r)] = r
  return sorted(latest.values(), key=lambda r: r.get("step", 0))


def status_line(status: dict | None) -> str:
  """ "finished (M of M steps)" / "stopped at step N of M" from status.json."""
  if not status:
    return "unknown (no status.json: the run is going on or was killed)"
  n, m = status.get("step"), status.get("steps")
  if status.get("status") == "stopped":
    return (
      f"stopped at step {n} of {m} (signal); rerun the same command to resume"
    )
  return f"finished ({n} of {m} steps)"


def _cell(d: dict | None, k: str) -> str:
  """An eval metric as "mean% [low, high]", or "-"."""
  if not d or k not in d:
    return "-"
  lo, hi = d.get(k + "_lo"), d.get(k + "_hi")
  ci = f" [{100 * lo:.1f}, {100 * hi:.1f}]" if lo is not None else ""
  return f"{100 * d[k]:.1f}%{ci}"


def eval_line(d: dict) -> str:
  """An evaluation on one line: its accuracy (pass@1: every sample's mean)
  with the 95% interval, pass@k and maj@k for k > 1 (report.md's table
  has every metric), then what was evaluated where the loop recorded it
  ("140 held-out problems, greedy")."""
  ks = sorted(
    (k.startswith("eval/maj"), int(k.split("@")[1]), k)
    for k in d
    if k.startswith(("eval/pass@", "eval/maj@")) and k.split("@")[1].isdigit()
  )
  parts = [f"accuracy {_cell(d, 'eval/pass@1')}"] if "eval/pass@1" in d else []
  parts += [f"{k[5:]} {_cell(d, k)}" for _, n, k in ks if n > 1]
  if "problems" in d:
    n, shared, samples = d["problems"], d.get("trained_on"), d.get("samples", 1)
    held = f"problems ({shared} trained on)" if shared else "held-out problems"
    how = "greedy" if samples == 1 else f"{samples} samples each"
    parts.append(f"{n} {held}, {how}")
  return " | ".join(parts)


# The training table's rows after the curves': cut rows, where the step's
# time goes, and (on a GPU or TPU) the updates' model FLOPs utilisation.
_SPEED = (
  "truncated",
  "time/rollout",
  "time/update",
  "time/step",
  "tokens_per_sec",
  "mfu/update",
)


def write(workdir: str, title: str = "") -> str:
  """Writes workdir/report.md and workdir/curves.png; returns the md path.

  In a multi-process run only process 0 writes.
  """
  import jax  # Lazy: the report CLI never starts a JAX backend.

  path = os.path.join(workdir, "report.md")
  if jax.distributed.is_initialized() and jax.process_index() != 0:
    return path
  run = epath.Path(workdir)
  rows = last_row_per_step(metrics_lib.read_jsonl(run / "metrics.jsonl"))
  cfg = storage.read_json(run / "config.json") or {}
  status = storage.read_json(run / "status.json")
  before = storage.read_json(run / "eval_before.json")
  after = storage.read_json(run / "eval_after.json")
  commit = ""
  if (run / "COMMIT").exists():
    commit = (run / "COMMIT").read_text().strip()
  scope = after or before or {}
  shared, problems = scope.get("trained_on"), scope.get("problems")
  plot_curves(
    rows,
    run / "curves.png",
    title,
    f"eval ({shared} of {problems} trained on)"
    if shared
    else "held-out (eval)",
  )
  train = [r for r in rows if "reward" in r]
  where = os.path.abspath(workdir) if storage.is_local(workdir) else workdir
  if not title and (run / "report.md").exists():  # the run's own title
    heading = (run / "report.md").read_text().partition("\n")[0]
    title = heading[2:] if heading.startswith("# ") else ""
  lines = [
    f"# {title or cfg.get('class', 'Run')}",
    "",
    f"- workdir: `{where}`",
    f"- commit: `{commit}`",
    f"- model: `{cfg.get('model')}` ({_init(cfg)}), data: `{cfg.get('data')}`",
    f"- status: {status_line(status)}",
    f"- RL steps logged: {len(train)}",
    "",
  ]
  if before or after:
    lines += [
      f"## Evaluation ({shared} of {problems} problems are training problems)"
      if shared
      else "## Held-out evaluation",
      "",
      "| metric | before RL | after RL |",
      "|---|---|---|",
    ]
    keys = sorted(
      k
      for k in (after or before)
      if k.startswith("eval/") and not k.endswith(("_lo", "_hi"))
    )
    for k in keys:
      lines.append(f"| {k[5:]} | {_cell(before, k)} | {_cell(after, k)} |")
    lines.append("")
  if train:
    first, last = train[:10], train[-10:]
    lines += [
      "## Training (mean of first / last 10 steps)",
      "",
      "| metric | start | end |",
      "|---|---|---|",
    ]
    for key in [k for k, _ in CURVES] + list(_SPEED):
      vals = [
        [r[key] for r in part if isinstance(r.get(key), (int, float))]
        for part in (first, last)
      ]
      if all(vals):
        lines.append(
          f"| {key} | {np.mean(vals[0]):.3f} | {np.mean(vals[1]):.3f} |"
        )
    lines.append("")
  lines += ["## Curves", "", "![curves](curves.png)", ""]
  (run / "report.md").write_text("\n".join(lines))
  return path


def main(argv: list[str]) -> int:
  """`python -m rlreason.train.report WORKDIR`: writes and names report.md."""
  if len(argv) != 2:
    print("usage: python -m rlreason.train.report WORKDIR", file=sys.stderr)
    return 2
  if not epath.Path(argv[1], "metrics.jsonl").exists():
    print(f"error: {argv[1]}: no metrics.jsonl (not a run's workdir)",
          file=sys.stderr)  # fmt: skip
    return 2
  print(write(argv[1]))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
