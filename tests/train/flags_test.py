"""Flags from Config dataclasses: help from the fields' comments, grouping
by module, parsing; and every experiment's flags documented."""

import dataclasses
import importlib
import pkgutil
import re
import subprocess
import sys

import pytest
from absl import flags as absl_flags

import experiments
from rlreason.train import flags


@dataclasses.dataclass(frozen=True)
class _Base:
  # Group heading: not a field's help.

  plain: int = 1  # what plain means
  # What block means,
  # over two lines.
  block: float = 0.5
  bare: str = ""

  # Another heading, above a field with a comment of its own.
  headed: bool = False  # what headed means


@dataclasses.dataclass(frozen=True)
class _Experiment(_Base):
  plain: int = 2  # the experiment's note
  block: float = 0.25
  own: str = "x"  # an experiment's own knob
  told: int = dataclasses.field(default=3, metadata={"help": "from metadata"})


@dataclasses.dataclass(frozen=True)
class _Variant(_Experiment):
  plain: int = 4
  block: float = 0.75  # (2) the variant's value


def test_help_is_the_declaring_comment_with_the_value_owners_note():
  got = {
    name: text for name, (text, _) in flags.field_help(_Experiment).items()
  }
  assert got == {
    "plain": "what plain means [flags_test: the experiment's note]",
    "block": "What block means, over two lines.",  # its value's class: none
    "bare": "bare",  # no comment anywhere: the name
    "headed": "what headed means",  # the heading above it is dropped
    "own": "an experiment's own knob",
    "told": "from metadata",
  }
  variant = flags.field_help(_Variant)
  assert variant["block"][0] == (
    "What block means, over two lines. [flags_test: (2) the variant's value]"
  )
  assert variant["plain"][0] == "what plain means"
  assert variant["own"][0] == got["own"]  # inherited value and help


def test_fields_are_grouped_by_the_module_that_sets_them():
  from experiments import dapo

  modules = {
    name: module for name, (_, module) in flags.field_help(dapo.Config).items()
  }
  assert modules["overlong_buffer"] == "experiments.dapo"  # its own field
  assert modules["clip_eps_high"] == "experiments.dapo"  # a value it sets
  assert modules["lr"] == "rlreason.config"  # set by grpo, declared there
  assert modules["advantage"] == "rlreason.rl.pg_config"


def test_defined_flags_parse_into_the_config():
  values = absl_flags.FlagValues()
  flags.define_from_dataclass(_Variant, values)
  values(["prog", "--plain=7", "--block=0.125", "--noheaded", "--own=y"])
  assert (values.plain, values.block, values.headed, values.own) == (
    7,
    0.125,
    False,
    "y",
  )
  assert values["block"].help.endswith("[flags_test: (2) the variant's value]")
  own = {f.name for f in values.get_flags_for_module(__name__)}
  assert own == {"plain", "block", "bare", "headed", "own", "told"}


def _configs():
  for info in pkgutil.iter_modules(experiments.__path__):
    module = importlib.import_module(f"experiments.{info.name}")
    cfg = getattr(module, "Config", None)
    if cfg is not None and dataclasses.is_dataclass(cfg):
      yield info.name, cfg


def test_every_experiment_flag_says_what_it_means():
  """Each flag's help (before an experiment's bracketed note) has at least
  two words besides its own name's: a new field needs a comment."""
  undocumented = []
  names = []
  for name, cfg in _configs():
    names.append(name)
    for field, (text, _) in flags.field_help(cfg).items():
      meaning = text.split(" [")[0]
      words = re.findall(r"[A-Za-z]{3,}", meaning)
      if len([w for w in words if w not in field.split("_")]) < 2:
        undocumented.append(f"{name}.Config.{field}: {text!r}")
  assert len(names) >= 43, names  # the experiments, pretrain and evaluate
  assert not undocumented, "\n".join(undocumented)


def test_help_lists_the_experiments_own_flags():
  out = subprocess.run(
    [sys.executable, "-m", "experiments.dapo", "--help"],
    capture_output=True,
    text=True,
    timeout=120,
  ).stdout  # absl's --help exits with status 1
  listed = out[out.index("flags:") :]
  assert "--overlong_buffer: (4) L_cache of Eq. 13" in listed
  assert "--clip_eps_high: The ratio's clip range: up to 1 + this" in listed
  assert "--[no]dynamic_sampling: (2) drop all-equal groups" in listed
  assert "--lr:" not in listed  # grpo's, shown by --helpfull
  full = subprocess.run(
    [sys.executable, "-m", "experiments.dapo", "--helpfull"],
    capture_output=True,
    text=True,
    timeout=120,
  ).stdout
  base = full[full.index("\nrlreason.config:") :]
  assert "--lr: peak learning rate (AdamW) [grpo:" in base


@pytest.mark.parametrize("bad", [[], {"a": 1}])
def test_only_scalar_fields_become_flags(bad):
  cls = dataclasses.make_dataclass(
    "Bad", [("x", type(bad), dataclasses.field(default_factory=lambda: bad))]
  )
  with pytest.raises(TypeError, match="only bool/int/float/str"):
    flags.define_from_dataclass(cls, absl_flags.FlagValues())
