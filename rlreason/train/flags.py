"""Dataclass <-> absl flags: one --flag per Config field.

Call `define_from_dataclass(Config)` only under `if __name__ == "__main__"`,
so importing an experiment defines no flags (tests and notebooks import many
experiments in one process).

`--scale=paper` starts from `replace(Config(), **paper)` (the experiment's
PAPER overrides); flags given on the command line override either scale.

Exit codes of an experiment run through `run_main`:
  0   finished
  1   failed (a traceback; a checkpoint that could not be written: one line)
  2   usage error, found before any compute: a flag out of range, a path
      that cannot be used, a bad data file or prompt (one line per problem)
  75  stopped by SIGTERM / SIGINT after checkpointing (EX_TEMPFAIL): rerun
      the same command to resume
"""

import dataclasses
import sys
import traceback
from typing import Callable

import jax

from absl import app
from absl import flags
from absl import logging

from rlreason import config
from rlreason import devices
from rlreason.data import sources
from rlreason.train import checkpoint

EXIT_USAGE = 2
EXIT_STOPPED = 75

_DEFINE = {
  bool: flags.DEFINE_boolean,
  int: flags.DEFINE_integer,
  float: flags.DEFINE_float,
  str: flags.DEFINE_string,
}


def define_from_dataclass(cls) -> None:
  """One --flag per field; default and help come from the field."""
  for f in dataclasses.fields(cls):
    default = f.default
    kind = type(default)
    if kind not in _DEFINE:
      raise TypeError(
        f"{cls.__name__}.{f.name}: only bool/int/float/str "
        f"fields become flags, got {kind.__name__}"
      )
    _DEFINE[kind](f.name, default, f.metadata.get("help", f.name))


def parse_dataclass(cls, paper: dict | None = None):
  """Builds `cls` from parsed flags. Call inside app.run's main."""
  values = flags.FLAGS
  cfg = cls()
  if values["scale"].value == "paper":
    if paper is None:
      raise ValueError(f"{cls.__module__} has no paper-scale settings")
    cfg = dataclasses.replace(cfg, **paper)
  explicit = {
    f.name: values[f.name].value
    for f in dataclasses.fields(cls)
    if values[f.name].present
  }
  return dataclasses.replace(cfg, **explicit)


def run_main(cls, run: Callable, paper: dict | None = None) -> None:
  """The body of an experiment's `if __name__ == "__main__":`.

  Defines the flags, parses them into `cls` and calls `run(cfg)`. Library
  INFO logs (orbax prints several lines per checkpoint) are hidden unless
  --verbosity is given; progress lines are printed regardless.
  """
  define_from_dataclass(cls)
  devices.no_tpu_probe_without_tpus()

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    sys.exit(run_checked(run, parse_dataclass(cls, paper)))

  app.run(main)


def out_of_memory_line(error: Exception, turn: str) -> str:
  """The line a command prints after the traceback of a program that ran
  out of device memory: XLA's own line, then the knobs to `turn`."""
  lines = str(error).splitlines() or [""]
  line = next((l for l in lines if devices.out_of_memory(l)), lines[0])
  return f"error: out of device memory ({line.strip()}). Turn: {turn}"


def run_checked(run: Callable, cfg) -> int:
  """Calls `run(cfg)`; returns the exit code (module docstring), printing
  usage and checkpoint errors as one message instead of a traceback."""
  try:
    cfg.validate()
    out = run(cfg)
  except (config.ConfigError, sources.DataError) as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE
  except ValueError as e:
    if str(e).startswith("Invalid config:"):  # experiments' own validate
      print(f"error: {e}", file=sys.stderr)
      return EXIT_USAGE
    raise
  except checkpoint.CheckpointError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except jax.errors.JaxRuntimeError as e:
    if not devices.out_of_memory(str(e)):
      raise
    traceback.print_exc()
    turn = (
      f"--micro_batches={2 * cfg.micro_batches} (smaller micro-batches), "
      "--rollout_rows (fewer sequences per sampler call), --remat, --mesh_* "
      "(more devices), a smaller --max_new_tokens; `python -m "
      "experiments.plan` sizes them for a TPU slice. Rerun the same command "
      "to resume from the last checkpoint."
    )
    print(out_of_memory_line(e, turn), file=sys.stderr)
    return 1
  except checkpoint.Stopped as e:
    print(
      f"Stopped: {e}; rerun the same command to resume (exit code "
      f"{EXIT_STOPPED}).",
      file=sys.stderr,
    )
    return EXIT_STOPPED
  if isinstance(out, dict) and out.get("stopped"):
    print(
      f"Stopped at step {out.get('step')} of {cfg.steps}; rerun the same "
      f"command to resume (exit code {EXIT_STOPPED}).",
      file=sys.stderr,
    )
    return EXIT_STOPPED
  return 0
