"""Dataclass <-> absl flags: one --flag per Config field.

Call `define_from_dataclass(Config)` only under `if __name__ == "__main__"`,
so importing an experiment defines no flags (tests and notebooks import many
experiments in one process).

A flag's help is its field's comment (field_help): the comment where the
field is first declared (what it means: rlreason/config.py,
objective.PGConfig) and, where a subclass sets it with a comment of its own,
that one after it ("[dapo: (3)]", the item of the experiment's docstring).
`--help` lists the fields the experiment's own module sets; `--helpfull`
the rest too, grouped by the module that declares them.

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

import ast
import dataclasses
import functools
import inspect
import io
import os
import sys
import textwrap
import tokenize
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

_PARSERS = {
  int: flags.IntegerParser,
  float: flags.FloatParser,
  str: flags.ArgumentParser,
}


@functools.cache
def _declared_comments(klass) -> dict[str, str]:
  """The comments of the fields `klass` itself declares: the comment lines
  right above each (no blank line between) and the comment on its own
  lines. A block after a blank line above a field with a comment of its
  own heads a group of fields (BaseConfig's "# Sampling."), not that one.
  {} where the source cannot be read (a class made at run time)."""
  try:
    source = textwrap.dedent(inspect.getsource(klass))
  except (OSError, TypeError):
    return {}
  lines = source.splitlines()
  comments = {  # line number -> text, for comment tokens
    t.start[0]: t.string.lstrip("#").strip()
    for t in tokenize.generate_tokens(io.StringIO(source).readline)
    if t.type == tokenize.COMMENT
  }

  def own_line(n):
    return lines[n - 1].lstrip().startswith("#")

  found = {}
  for stmt in ast.parse(source).body[0].body:
    if not (
      isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ):
      continue
    inline = [
      comments[n]
      for n in range(stmt.lineno, stmt.end_lineno + 1)
      if n in comments and not own_line(n)
    ]
    first = stmt.lineno
    while first - 1 in comments and own_line(first - 1):
      first -= 1
    block = [comments[n] for n in range(first, stmt.lineno)]
    if block and inline and first > 1 and not lines[first - 2].strip():
      block = []  # a group's heading
    text = " ".join(block + inline).strip()
    if text:
      found[stmt.target.id] = text
  return found


def field_help(cls) -> dict[str, tuple[str, str]]:
  """Field name -> (help, module) for the flags of a Config dataclass.

  The help is the field's comment where it is first declared (what it
  means), then, in brackets, the comment of the subclass whose value is in
  effect, where that is another class and has one ("lr: peak learning rate
  (AdamW) [grpo: 5e-4 and above made the tiny policy worse]"); a field's
  metadata["help"] replaces both. The module is `cls`'s own where a class
  of that module declares the field (the experiment's knobs: `--help`),
  else that of the first class that declared it."""
  classes = [k for k in reversed(cls.__mro__) if dataclasses.is_dataclass(k)]
  out = {}
  for f in dataclasses.fields(cls):
    owners = [
      k for k in classes if f.name in k.__dict__.get("__annotations__", {})
    ]
    said = [_declared_comments(k).get(f.name, "") for k in owners]
    text = next((s for s in said if s), "")
    if len(owners) > 1 and said[-1] and said[-1] != text:
      where = os.path.basename(inspect.getfile(owners[-1])).removesuffix(".py")
      text = f"{text} [{where}: {said[-1]}]"
    text = f.metadata.get("help", text) or f.name
    own = any(k.__module__ == cls.__module__ for k in owners)
    module = cls.__module__ if own or not owners else owners[0].__module__
    out[f.name] = (text, module)
  return out


def define_from_dataclass(cls, flag_values=flags.FLAGS) -> None:
  """One --flag per field; default and help (field_help) from the field."""
  docs = field_help(cls)
  for f in dataclasses.fields(cls):
    name, default, kind = f.name, f.default, type(f.default)
    text, module = docs[name]
    if kind is bool:
      flag = flags.BooleanFlag(name, default, text)
    elif kind in _PARSERS:
      flag = flags.Flag(
        _PARSERS[kind](), flags.ArgumentSerializer(), name, default, text
      )
    else:
      raise TypeError(
        f"{cls.__name__}.{name}: only bool/int/float/str "
        f"fields become flags, got {kind.__name__}"
      )
    if module == "__main__":  # absl's name for the program's own flags
      module = sys.argv[0]
    flags.DEFINE_flag(flag, flag_values, module_name=module)


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
  except ValueError as e:  # validate's: every one a flag's (an experiment's
    # own checks raise plain ValueErrors too)
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE
  try:
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
