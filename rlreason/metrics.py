"""Metrics: metrics.jsonl in the workdir (always), TensorBoard, optional wandb.

Only process 0 writes (`enabled=False` elsewhere). Each jsonl line is
{"step": int, "time": seconds since start, <name>: float, ...}.
"""

import json
import math
import os
import sys
import time

import numpy as np


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
  ):
    self.enabled = enabled
    self._start = time.time()
    self._tb = self._wandb = None
    self._file = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, filename)
    self._file = open(self.path, "a")
    if tensorboard:
      from tensorboardX import SummaryWriter  # Lazy: optional at import time.

      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    if wandb_project:
      import wandb

      self._wandb = wandb.init(
        project=wandb_project, config=config, dir=workdir, resume="allow"
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
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(scalars, step=step)
    return scalars

  def close(self):
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class Progress:
  """One progress line per call, with rate and ETA."""

  def __init__(
    self, total: int, start_step: int = 0, stream=None, label: str = "step"
  ):
    self.total, self.start_step = total, start_step
    self.stream = stream or sys.stderr
    self.label = label
    self._t0 = time.time()

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
    return line


def _fmt_time(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
