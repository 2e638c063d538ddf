"""Metrics: metrics.jsonl in the workdir (always), TensorBoard, optional wandb.

Only process 0 writes (`enabled=False` elsewhere). Each jsonl line is
{"step": int, "time": seconds since start, <name>: float, ...}.

The workdir may be a gs:// URL (rlreason/storage.py). An object store
cannot append, so there the writer keeps the file's lines (those of an
earlier run included, on resume) and rewrites the object at most every
`upload_secs` and on close; a local metrics.jsonl is appended to and
flushed at every write.

A resumed run passes `keep_through=<restored step>`: rows logged after it
(the steps the run is about to redo) are cut from the file, so no step is
logged twice; a torn last line (the process died mid-write) is dropped.
TensorBoard hides its events after that step (SummaryWriter's
purge_step), and wandb continues the workdir's own run (its id is kept in
<workdir>/wandb_run_id; the redone steps, which wandb does not take below
the last one logged, replay the same numbers). A fresh run (keep_through
-1) purges TensorBoard's earlier events and starts another wandb run.
"""

import contextlib
import json
import math
import os
import sys
import threading
import time
import uuid

import numpy as np
from etils import epath

from rlreason import storage


def _scalar(v) -> float:
  return float(np.asarray(v).astype(np.float64).mean())


class MetricWriter:
  def __init__(
    self,
    workdir: str,
    *,
    enabled: bool = True,
    tensorboard: bool = True,
    wandb_project: str = "",
    config: dict | None = None,
    filename: str = "metrics.jsonl",
    upload_secs: float = 30.0,
    keep_through: int | None = None,
  ):
    self.enabled = enabled
    self._start = time.time()
    self._tb = self._wandb = None
    self._file = None
    self._lines = None  # remote workdirs: every line of the object
    self._uploaded = 0.0  # time of the last upload (remote)
    self._upload_secs = upload_secs
    if not enabled:
      return
    workdir = epath.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    self.path = workdir / filename
    kept = _kept_lines(self.path, keep_through)
    if storage.is_local(self.path):
      if kept is not None:
        self.path.write_text("".join(kept))
      self._file = open(self.path, "a")
    else:
      self._lines = kept or []  # a resumed run continues the object
      self._uploaded = time.time()
    if tensorboard:
      from tensorboardX import SummaryWriter  # Lazy: optional at import time.

      # gs:// needs google-cloud-storage (tensorboardX's GCS writer).
      self._tb = SummaryWriter(
        os.fspath(workdir / "tensorboard"),
        # Steps after keep_through are redone: TensorBoard hides the
        # earlier run's events from there on.
        purge_step=None if keep_through is None else keep_through + 1,
      )
    if wandb_project:
      import wandb

      self._wandb = wandb.init(
        project=wandb_project,
        config=config,
        dir=os.fspath(workdir) if storage.is_local(workdir) else None,
        id=_wandb_run_id(
          workdir, resumed=keep_through is not None and keep_through >= 0
        ),
        resume="allow",
      )

  def write(self, step: int, metrics: dict) -> dict:
    """Writes scalars (arrays are averaged); returns them as floats."""
    scalars = {k: _scalar(v) for k, v in metrics.items()}
    if not self.enabled:
      return scalars
    row = {
      "step": int(step),
      "time": round(time.time() - self._start, 3),
      **{k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()},
    }
    line = json.dumps(row) + "\n"
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, step)
    if self._file is not None:  # local: append and flush every row
      self._file.write(line)
      self.flush()
    else:  # remote: rewrite the object at most every upload_secs
      self._lines.append(line)
      if time.time() - self._uploaded >= self._upload_secs:
        self.flush()
    if self._wandb is not None:
      self._wandb.log(scalars, step=step)
    return scalars

  def flush(self) -> None:
    """Makes every row written so far visible in the workdir."""
    if self._file is not None:
      self._file.flush()
    elif self._lines is not None:
      self.path.write_text("".join(self._lines))
      self._uploaded = time.time()
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    """Flushes and closes (again is a no-op)."""
    if self._lines is not None:
      self.flush()  # the last rows of a remote metrics.jsonl
      self._lines = None
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()  # however the run ends: a remote file's last rows too


def _wandb_run_id(workdir: epath.Path, resumed: bool) -> str:
  """The workdir's wandb run id: the one <workdir>/wandb_run_id keeps when
  `resumed`, else a new one, kept there."""
  path = workdir / "wandb_run_id"
  if resumed and path.exists() and (kept := path.read_text().strip()):
    return kept
  new = uuid.uuid4().hex[:12]
  path.write_text(new + "\n")
  return new


def _parsed(path: epath.Path) -> list[tuple[str, dict]]:
  """(line, row) for each line of a jsonl; a torn last line is dropped.

  A torn line anywhere else is an error naming the file and line.
  """
  lines = [s for s in path.read_text().splitlines() if s.strip()]
  out = []
  for i, line in enumerate(lines):
    try:
      out.append((line, json.loads(line)))
    except json.JSONDecodeError as e:
      if i < len(lines) - 1:
        raise ValueError(f"{path}:{i + 1}: not a JSON line: {e}") from None
      print(f"{path}: skipped a torn last line", file=sys.stderr)
  return out


def _kept_lines(path: epath.Path, keep_through: int | None):
  """The lines of an existing jsonl to keep, or None if there is none:
  without a torn last line and, with `keep_through`, without later steps."""
  if not path.exists():
    return None
  return [
    line + "\n"
    for line, row in _parsed(path)
    if keep_through is None or row.get("step", 0) <= keep_through
  ]


def read_jsonl(path: epath.PathLike) -> list[dict]:
  """The rows of a jsonl file (local or gs://); a torn last line is skipped."""
  return [row for _, row in _parsed(epath.Path(path))]


def step_row(
  update_metrics, batch_metrics, rollout, times, update_flops=None
) -> dict:
  """A step's metrics.jsonl row: the updates' metrics averaged (the counts
  of skipped and empty updates summed), make_batch's, the rollout's
  lengths, and the seconds of its phases from times = (start, rollout
  done, batch made, updated).
  update_flops = (model FLOPs of the updates, all the devices' peak
  FLOP/s) adds "mfu/update", their model FLOPs utilisation."""
  t0, t1, t2, t3 = times
  lengths = rollout.lengths
  keys = dict.fromkeys(k for m in update_metrics for k in m)
  row = {k: np.mean([m[k] for m in update_metrics if k in m]) for k in keys}
  for key in ("skipped", "empty"):  # counts of updates
    if key in row:
      row[key] = float(np.sum([m[key] for m in update_metrics if key in m]))
  if update_flops is not None:
    flops, peak = update_flops
    row["mfu/update"] = flops / (max(t3 - t2, 1e-9) * peak)
  return {
    **row,
    **batch_metrics,
    "length": lengths.mean(),
    "length_max": lengths.max(),
    "truncated": np.mean(rollout.finish_reasons == "length"),
    "time/rollout": t1 - t0,
    "time/reward": t2 - t1,
    "time/update": t3 - t2,
    "time/step": t3 - t0,
    "tokens_per_sec": lengths.sum() / max(t1 - t0, 1e-9),
  }


def own_update_metrics(update_metrics: list[dict], name: str) -> list[dict]:
  """The metrics of updates that train params beside the policy alone
  (e.g. a critic's own updates), for step_row beside the policy's: their
  loss and grad_norm as "<name>/loss" and "<name>/grad_norm"; their
  skipped and empty updates counted with the policy's."""
  own = ("loss", "grad_norm")
  return [
    {(f"{name}/{k}" if k in own else k): v for k, v in m.items()}
    for m in update_metrics
  ]


class Progress:
  """One progress line per `update`, with rate and ETA; `maybe` prints one
  only when `every` seconds have passed since the last line (or the start),
  for long work that should speak up without flooding a short run."""

  def __init__(
    self,
    total: int,
    start_step: int = 0,
    stream=None,
    label: str = "step",
    every: float = 0.0,
  ):
    self.total, self.start_step = total, start_step
    self.stream = stream or sys.stderr
    self.label = label
    self.every = every
    self._t0 = self._shown = time.time()

  def maybe(self, step: int, metrics: dict | None = None) -> str | None:
    """`update` when a line is due; None otherwise."""
    if time.time() - self._shown < self.every:
      return None
    return self.update(step, metrics)

  def update(
    self,
    step: int,
    metrics: dict | None = None,
    keys=("reward", "accuracy", "loss", "length"),
  ):
    done = step - self.start_step
    elapsed = time.time() - self._t0
    eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
    parts = [f"{self.label} {step}/{self.total}"]
    for k in keys:
      if metrics and k in metrics:
        parts.append(f"{k} {_scalar(metrics[k]):.3f}")
    parts.append(f"{_fmt_time(elapsed)} elapsed, ETA {_fmt_time(eta)}")
    line = " | ".join(parts)
    print(line, file=self.stream, flush=True)
    self._shown = time.time()
    return line


def _fmt_time(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


# A compilation at least this long is reported while it runs (every this
# many seconds) and when it ends: a 7B-32B train step or sampler compiles
# for minutes on a TPU host before the run's first progress line.
COMPILE_SECONDS = 30.0
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compile_lines(
  enabled: bool = True, every: float | None = None, stream=None
):
  """Inside it, every XLA compilation longer than `every` seconds (default
  COMPILE_SECONDS) says so on stderr as it runs, `compiling jit(step):
  1:00 so far`, and once done, `compiled jit(step) in 2:13` (JAX's
  monitoring events; programs the persistent cache holds load quickly and
  say nothing). `enabled=False` (processes other than 0) prints nothing."""
  if not enabled:
    yield
    return
  from jax import monitoring

  every = COMPILE_SECONDS if every is None else every
  stream = stream or sys.stderr
  running = []  # [name, start, next line's seconds]: compilations under way
  lock, done = threading.Lock(), threading.Event()

  def say(line):
    print(line, file=stream, flush=True)

  def started(event, value, **kwargs):
    if event == _COMPILE_EVENT:
      with lock:
        running.append([kwargs.get("fun_name", "?"), time.time(), every])

  def ended(event, seconds, **kwargs):
    if event != _COMPILE_EVENT:
      return
    name = kwargs.get("fun_name", "?")
    with lock:  # lines in order: none of its own after this one
      mine = [r for r in running if r[0] == name]
      if mine:
        running.remove(mine[0])
      if seconds >= every:
        say(f"compiled {name} in {_fmt_time(seconds)}")

  def watch():
    while not done.wait(min(1.0, max(every, 0.01))):
      now = time.time()
      with lock:
        for entry in running:
          name, start, due = entry
          if now - start >= due:
            say(f"compiling {name}: {_fmt_time(now - start)} so far")
            entry[2] = due + every

  monitoring.register_scalar_listener(started)
  monitoring.register_event_duration_secs_listener(ended)
  thread = threading.Thread(target=watch, name="compile-lines", daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
    monitoring.unregister_scalar_listener(started)
    monitoring.unregister_event_duration_listener(ended)
