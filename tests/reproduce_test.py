"""experiments/reproduce.py: runs, reuses runs, writes table and plot."""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

from experiments import reproduce
from rlreason import testing
from rlreason.eval import reproduction
from rlreason.train import run_info

# testing.SMOKE but its step count (reproduce's runs set their own).
TINY = {k: v for k, v in testing.SMOKE.items() if k != "steps"}


@pytest.mark.parametrize("name", sorted(reproduce.CLAIMS))
def test_every_claim_names_valid_configs(name):
  claim = reproduce.CLAIMS[name]
  assert len(claim.variants) >= 2
  assert set(claim.base) <= set(claim.variants), claim.base
  assert "tiny" in claim.testbeds and set(claim.testbeds) <= set(
    reproduce.TESTBEDS
  )
  assert not claim.base or "base" in claim.testbeds, claim.base
  for testbed in reproduce.TESTBEDS:
    for label in claim.variants:
      if testbed not in claim.testbeds:
        with pytest.raises(ValueError, match="runs only on --testbed=tiny"):
          claim.overrides(label, testbed)
        continue
      module_name, overrides = claim.overrides(label, testbed)
      _, cfg = reproduce._config(module_name, overrides, 0, 0, testbed)
      cfg.validate()


# Settings a claim's arms differ in by design: the claim's subject.
ARMS_DIFFER_IN = {
  "dler": ("max_new_tokens",),  # its length limit
  "truncated_ppo": ("max_new_tokens",),  # its window, vs PPO's budget
  "simplerl_zoo": ("data",),  # too_hard's level
}


@pytest.mark.parametrize("name", sorted(reproduce.CLAIMS))
def test_the_arms_of_a_claim_draw_from_the_same_data(name):
  # dump's uniform arm once drew from the tiny testbed's arithmetic mixture
  # on the base, while dump's own data became the main job's one level.
  claim = reproduce.CLAIMS[name]
  keys = ("model", "data", "eval_data", "eval_size", "max_new_tokens")
  keys = [k for k in keys if k not in ARMS_DIFFER_IN.get(name, ())]
  for testbed in claim.testbeds:
    got = {}
    for label in claim.variants:
      module_name, overrides = claim.overrides(label, testbed)
      _, cfg = reproduce._config(module_name, overrides, 0, 0, testbed)
      got[label] = {k: getattr(cfg, k) for k in keys}
    first = next(iter(got.values()))
    assert all(g == first for g in got.values()), (testbed, got)


def test_the_curriculum_claims_draw_from_the_bases_own_levels_on_it():
  from rlreason.data import sources

  for name in ("dump", "adacl"):
    claim = reproduce.CLAIMS[name]
    for label in claim.variants:
      module_name, overrides = claim.overrides(label, "base")
      _, cfg = reproduce._config(module_name, overrides, 0, 0, "base")
      assert cfg.data.startswith("task:addsub5:difficulty=1-3,"), (name, label)
  # The mixture loads: each level holds as many distinct prompts as asked
  # (3000 once asked for more level-1 prompts than there are).
  mix = reproduce.CLAIMS["dump"].base["uniform"]
  train = sources.load(mix["data"])
  held_out = sources.load(mix["eval_data"])
  assert len(held_out) == mix["eval_size"]
  assert {e.question for e in train}.isdisjoint(e.question for e in held_out)


def test_the_base_testbed_is_the_main_job_with_the_experiments_own_fixes():
  from experiments import dler
  from experiments import grpo

  _, cfg = reproduce._config("grpo", {}, 3, 0, "base")
  main = grpo.Config()
  assert cfg == dataclasses.replace(
    main,
    eval_every=0,
    checkpoint_every=grpo.TinyConfig.checkpoint_every,
    seed=3,
  )
  _, tiny = reproduce._config("grpo", {}, 3, 0, "tiny")
  assert tiny == grpo.TinyConfig(seed=3)
  # dler's 20-token limit was the tiny warm start's median: on the base
  # its BASE limit replaces it, and the claim's no_limit arm its own.
  claim = reproduce.CLAIMS["dler"]
  for label, want in (("dler", dler.BASE["max_new_tokens"]), ("no_limit", 128)):
    module_name, overrides = claim.overrides(label, "base")
    _, cfg = reproduce._config(module_name, overrides, 0, 0, "base")
    assert (cfg.model, cfg.warm_start_steps, cfg.max_new_tokens) == (
      "laptop-base",
      0,
      want,
    )
  module_name, overrides = claim.overrides("no_limit", "tiny")
  assert (
    reproduce._config(module_name, overrides, 0, 0, "tiny")[1].max_new_tokens
    == 40
  )
  with pytest.raises(ValueError, match="--testbed='nope'"):
    reproduce._config("grpo", {}, 0, 0, "nope")


# Settings a claim's variants may differ in, because the experiment warm-
# starts on its own value in every variant (sft.warm_started overrides).
WARM_START_SET_IN_RUN = {
  "simplerl_zoo": ("data",),  # --warm_start_data
  "dler": ("max_new_tokens",),  # --warm_start_max_new_tokens
  "truncated_ppo": ("max_new_tokens",),  # --max_response_len
}


@pytest.mark.parametrize("name", sorted(reproduce.CLAIMS))
def test_the_variants_of_a_claim_share_one_warm_start(name):
  # Else a variant's gain may be its starting point's (adacl's uniform
  # baseline once started from a warm start that saw no hints).
  from rlreason.train import sft

  allowed = WARM_START_SET_IN_RUN.get(name, ())
  settings = {}
  for label, (module_name, overrides) in reproduce.CLAIMS[
    name
  ].variants.items():
    _, cfg = reproduce._config(
      module_name, overrides, 0, 0, "tiny", workdir="w"
    )
    got = sft.warm_start_settings(cfg)
    settings[label] = {k: v for k, v in got.items() if k not in allowed}
  first = next(iter(settings.values()))
  for label, got in settings.items():
    assert got == first, (label, got, first)


def test_parse_overrides_types_values():
  got = reproduce.parse_overrides(
    "batch_size=8,lr=0.5,tensorboard=false,data=task:x", ["grpo"]
  )
  assert got == dict(batch_size=8, lr=0.5, tensorboard=False, data="task:x")
  # A data spec holds commas: they stay in the string value.
  got = reproduce.parse_overrides(
    "data=task:addsub5:difficulty=3,n=200,lr=0.5", ["grpo"]
  )
  assert got == dict(data="task:addsub5:difficulty=3,n=200", lr=0.5)
  with pytest.raises(ValueError, match="no Config field 'nope'"):
    reproduce.parse_overrides("nope=1", ["grpo"])
  with pytest.raises(ValueError, match="steps='x' is not of type int"):
    reproduce.parse_overrides("steps=x", ["grpo"])


def test_the_cli_names_a_bad_flag_before_any_run():
  """--seeds, --set and --method are read before the first run, and a bad
  one is a usage message (they were tracebacks)."""
  for flags, message in (
    (["--method=dr_grpo", "--seeds=a"], "--seeds='a': expected integers"),
    (["--method=dr_grpo", "--set=steps=x"], "--set: steps='x' is not of"),
    # --experiment, as experiments.plan names it, is --method here.
    (["--experiment=nosuch"], "--method='nosuch'; registered: adacl,"),
    # A claim the shipped base cannot run, on the default testbed.
    (["--method=igpo"], "--testbed=base: this claim runs only on"),
    # An arm the claim does not have, named with the ones it has.
    (
      ["--method=dars", "--variants=dars,dars_c"],
      "--variants: 'dars_c' not among dars's arms: dars, grpo_matched, "
      "brorl, dars_b",
    ),
  ):
    proc = subprocess.run(
      [sys.executable, "-m", "experiments.reproduce", *flags],
      capture_output=True,
      text=True,
      timeout=120,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_run_all_writes_table_and_plot_then_reuses_runs(tmp_path, monkeypatch):
  claim = reproduce.Claim(
    claim="tiny",
    variants={
      "grpo": ("grpo", {"kl_coef": 0.0}),
      "dr_grpo": ("dr_grpo", {}),
    },
    metric="length",
    expected="anything",
    extra=("accuracy",),
    evals=("eval/pass@2",),
  )
  common = dict(TINY, eval_samples=2, cache_dir=str(tmp_path / "cache"))
  root = str(tmp_path / "runs")

  def run_all(name, claim, common=common):
    return reproduce.run_all(
      name, claim, [0], steps=2, root=root, common=common, testbed_name="tiny"
    )

  path = run_all("tiny", claim)
  text = open(path).read()
  assert "| grpo |" in text and "| dr_grpo |" in text
  # The command that made the runs, every flag that changed them.
  (command,) = [
    line for line in text.splitlines() if line.startswith("Command")
  ]
  assert command.startswith(
    "Command: `python -m experiments.reproduce --method=tiny --seeds=0 "
    "--testbed=tiny --steps=2 --set="
  )
  assert "eval_samples=2" in command and command.endswith(f"--root={root}`")
  assert os.path.getsize(tmp_path / "runs/tiny/curves.png") > 0
  results = json.load(open(tmp_path / "runs/tiny/results.json"))
  assert len(results["variants"]["dr_grpo"]["length"]) == 1
  # The claim's eval keys come from eval_before/after.json, in [0, 1].
  assert "| eval/pass@2 before |" in text and "| eval/pass@2 after |" in text
  for column in ("eval/pass@2 before", "eval/pass@2 after"):
    (value,) = results["variants"]["grpo"][column]
    assert 0.0 <= value <= 1.0, (column, value)

  # A second call reuses the finished runs instead of training again.
  from experiments import grpo

  def fail(cfg):
    raise AssertionError("should have reused the finished run")

  monkeypatch.setattr(grpo, "run", fail)
  run_all("tiny", claim)
  # Another claim with the same grpo run links it instead of training.
  other = dataclasses.replace(
    claim, variants={"baseline": claim.variants["grpo"]}
  )
  run_all("other", other)
  linked = tmp_path / "runs/other/baseline/seed0"
  assert os.path.islink(linked)
  assert os.path.samefile(linked, tmp_path / "runs/tiny/grpo/seed0")
  # A config differing in one field is not a twin: it would train.
  with pytest.raises(AssertionError, match="should have reused"):
    run_all("third", other, common=dict(common, lr=1.0))
  # A different config in the same workdir is an error, not a silent reuse.
  with pytest.raises(ValueError, match="different config"):
    run_all("tiny", claim, common=dict(common, lr=1.0))


def test_a_run_stopped_by_sigterm_stops_the_reproduction(tmp_path, monkeypatch):
  from experiments import grpo

  ran = []

  def preempted(cfg):  # what loop.train does on SIGTERM: save, return early
    ran.append(cfg.workdir)
    os.makedirs(cfg.workdir)
    with open(os.path.join(cfg.workdir, "config.json"), "w") as f:
      json.dump(dataclasses.asdict(cfg), f)

  monkeypatch.setattr(grpo, "run", preempted)
  claim = reproduce.Claim(
    claim="tiny",
    variants={"a": ("grpo", {}), "b": ("grpo", {"lr": 1.0})},
    metric="accuracy",
    expected="anything",
  )
  root = str(tmp_path / "runs")
  with pytest.raises(reproduce.Interrupted, match="a/seed0 stopped before"):
    reproduce.run_all(
      "tiny", claim, [0], steps=2, root=root, common=TINY, testbed_name="tiny"
    )
  assert len(ran) == 1  # b did not start, and no partial table was written
  assert not os.path.exists(tmp_path / "runs/tiny/results.md")


def _finished_run(cfg, commit="c0ffee"):
  """A run that reached its last step, as _finished reads it."""
  os.makedirs(cfg.workdir)
  saved = {**dataclasses.asdict(cfg), "class": run_info.class_name(cfg)}
  for name, value in (("config", saved), ("eval_after", {})):
    with open(os.path.join(cfg.workdir, f"{name}.json"), "w") as f:
      json.dump(value, f)
  with open(os.path.join(cfg.workdir, "metrics.jsonl"), "w") as f:
    for step in (1, 2):
      f.write(json.dumps({"step": step, "loss": 0.0, "accuracy": 0.5}))
      f.write("\n")
  with open(os.path.join(cfg.workdir, "COMMIT"), "w") as f:
    f.write(commit + "\n")


def test_variants_runs_and_reports_those_arms_alone(tmp_path, monkeypatch):
  """--variants=c,a: arms a and c in the claim's order, b never configured
  or run, the table and its command naming only them."""
  from experiments import grpo

  ran = []

  def finished(cfg):
    ran.append(os.path.basename(os.path.dirname(cfg.workdir)))
    _finished_run(cfg)

  monkeypatch.setattr(grpo, "run", finished)
  claim = reproduce.Claim(
    claim="tiny",
    variants={
      "a": ("grpo", {}),
      "b": ("nosuch_module", {}),  # configuring it would fail
      "c": ("grpo", {"lr": 1.0}),
    },
    metric="accuracy",
    expected="anything",
  )

  def run_all(variants):
    return reproduce.run_all(
      "tiny",
      claim,
      [0],
      steps=2,
      root=str(tmp_path),
      common=TINY,
      testbed_name="tiny",
      variants=variants,
    )

  text = open(run_all(["c", "a"])).read()
  assert ran == ["a", "c"]
  assert "| a |" in text and "| c |" in text and "| b |" not in text
  assert "--variants=a,c " in text
  with pytest.raises(ValueError, match="'d' not among tiny's arms: a, b, c"):
    run_all(["a", "d"])


def test_a_run_reused_from_other_code_says_so_and_the_report_names_commits(
  tmp_path, monkeypatch, capsys
):
  """config.json cannot tell a change of code without a field, so reusing
  a run says which commit made it and which code files differ from it
  now, and results.md names the commits that made its runs."""
  from experiments import grpo

  claim = reproduce.Claim(
    claim="tiny",
    variants={"a": ("grpo", {}), "b": ("grpo", {"lr": 1.0})},
    metric="accuracy",
    expected="anything",
  )
  made = {"a": "abc123", "b": "def456"}
  monkeypatch.setattr(
    grpo,
    "run",
    lambda cfg: _finished_run(cfg, made[cfg.workdir.split(os.sep)[-2]]),
  )
  # def456: a change to code grpo does not import.
  changed = {
    "abc123": ["rlreason/rl/losses.py", "rlreason/train/reward_model.py"],
    "def456": ["rlreason/train/reward_model.py"],
  }
  monkeypatch.setattr(run_info, "code_changes", changed.get)

  def run_all():
    return reproduce.run_all(
      "tiny", claim, [0], steps=2, root=str(tmp_path), common=TINY,
      testbed_name="tiny",
    )  # fmt: skip

  text = open(run_all()).read()
  assert (
    "Code: the runs were made at 2 commits: abc123 (a/seed0); "
    "def456 (b/seed0)" in text
  )
  results = json.load(open(tmp_path / "tiny/results.json"))
  assert results["commits"] == {"abc123": ["a/seed0"], "def456": ["b/seed0"]}
  capsys.readouterr()
  run_all()  # both reused
  out = capsys.readouterr().out
  assert (
    "a seed 0: reusing " + str(tmp_path / "tiny/a/seed0") + " (made at "
    "abc123; 1 of its code files differ from it now: rlreason/rl/losses.py; "
    "delete it or pass another --root to rerun on this code)\n" in out
  )
  assert "b seed 0: reusing " + str(tmp_path / "tiny/b/seed0") + "\n" in out
  # Where git cannot tell (a tree shipped without .git), a run of today's
  # commit is today's code.
  monkeypatch.setattr(run_info, "code_changes", lambda commit: None)
  monkeypatch.setattr(run_info, "current_commit", lambda: "def456")
  run_all()
  out = capsys.readouterr().out
  assert "abc123; git cannot tell what changed since)" in out
  assert "b seed 0: reusing " + str(tmp_path / "tiny/b/seed0") + "\n" in out
  os.remove(tmp_path / "tiny/b/seed0/COMMIT")
  os.remove(tmp_path / "tiny/results.md")
  text = open(run_all()).read()
  assert "b seed 0: reusing" in capsys.readouterr().out
  assert "unknown (b/seed0)" in text


def test_code_files_follow_an_experiments_imports_and_no_others():
  """The code a run is made of: its experiment's file, the experiments and
  rlreason modules it imports at any depth, their packages; not the code
  of other experiments."""
  files = reproduction.code_files("experiments.dapo")
  for path in (
    "experiments/dapo.py",
    "experiments/grpo.py",  # dapo builds on it
    "rlreason/rl/dynamic_sampling.py",  # dapo's own import
    "rlreason/train/loop.py",  # through grpo
    "rlreason/model/transformer.py",  # deeper
    "rlreason/rl/__init__.py",  # a package it imports from
  ):
    assert path in files, path
  for path in ("experiments/rm_grpo.py", "rlreason/train/reward_model.py"):
    assert path not in files, path
  assert all((reproduction.REPO / f).exists() for f in files)


def test_a_field_added_later_at_its_default_is_the_same_run():
  from experiments import grpo

  cfg = grpo.Config()
  saved = dataclasses.asdict(cfg)
  saved["class"] = "experiments.grpo.Config"
  del saved["eval_max_new_tokens"]  # a run made before the field existed
  assert reproduce._differences(saved, cfg) == []
  assert reproduce._differences(
    saved, dataclasses.replace(cfg, eval_max_new_tokens=7)
  ) == ["eval_max_new_tokens"]
  saved["class"] = "experiments.dr_grpo.Config"
  assert reproduce._differences(saved, cfg) == ["class"]

  # A subclass default differs from the base default the field came with:
  # a run saved before the field existed ran at the base's behaviour.
  @dataclasses.dataclass(frozen=True)
  class Hinted(grpo.Config):
    warm_start_hints: float = 0.25

  cfg = Hinted()
  saved = dataclasses.asdict(cfg)
  saved["class"] = run_info.class_name(cfg)
  del saved["warm_start_hints"]
  assert reproduce._differences(saved, cfg) == ["warm_start_hints"]
  assert reproduce._differences(saved, Hinted(warm_start_hints=0.0)) == []

  # A field whose default changed what a run does (dapo's +1 / -1 reward,
  # 0 / 1 before it existed): a run recorded without it is not one of the
  # new default's, and is one of the old value's.
  from experiments import dapo

  cfg = dapo.Config()
  saved = {**dataclasses.asdict(cfg), "class": run_info.class_name(cfg)}
  del saved["signed_reward"]
  assert reproduce._differences(saved, cfg) == ["signed_reward"]
  old = dataclasses.replace(cfg, signed_reward=False)
  assert reproduce._differences(saved, old) == []


def test_configs_are_compared_after_the_experiments_resolve():
  """dars' run() resolves --variant presets before writing config.json."""
  from experiments import dars

  _, cfg = reproduce._config(
    "dars", {"variant": "dars_b"}, 0, 0, "tiny", workdir="x"
  )
  assert cfg.batch_size == dars.DARS_B["batch_size"] != dars.Config().batch_size
  assert dars.resolve(cfg) == cfg  # idempotent: run() applies it again


def test_a_root_made_from_other_weights_of_a_shipped_name_is_refused(
  tmp_path, monkeypatch
):
  from rlreason.model import presets

  ckpt = tmp_path / "base"
  ckpt.mkdir()
  (ckpt / "model.safetensors").write_bytes(b"version 1")
  monkeypatch.setitem(presets.SHIPPED, "fake-base", str(ckpt))
  root = str(tmp_path / "runs")
  cfg = types.SimpleNamespace(model="fake-base")
  reproduce._check_weights(cfg, root)  # noqa: SLF001 - records the digest
  reproduce._check_weights(cfg, root)  # noqa: SLF001 - the same weights
  (ckpt / "model.safetensors").write_bytes(b"version 2")
  with pytest.raises(ValueError, match="holds runs from other fake-base"):
    reproduce._check_weights(cfg, root)  # noqa: SLF001
  # A preset or a path names its weights itself: nothing recorded.
  other = str(tmp_path / "other")
  reproduce._check_weights(types.SimpleNamespace(model="tiny"), other)  # noqa: SLF001
  assert not os.path.exists(other)


# Arms whose token budget cuts their data's solutions by design: dler's
# limit is the claim's subject, truncated_ppo generates in windows, and a
# multi-turn episode's budget is per turn (its solution spans turns).
CUT_BY_DESIGN = {
  ("dler", "dler"),
  ("dler", "dler_script"),
  ("truncated_ppo", "truncated_ppo"),
  ("truncated_ppo", "critic_warmup"),
  ("igpo", "igpo"),
  ("igpo", "igpo_separate"),
  ("igpo", "search_r1"),
  ("search_r1", "masked"),
  ("search_r1", "unmasked"),
}


def test_every_claims_arms_can_write_their_datas_solutions():
  """A claim is about its method, not its budget: at 40 tokens, 2414 of
  simplerl_zoo's 4000 level-3 solutions did not fit its too_hard arm; at
  56, 562 of adacl's and dump's level 1-4 mixture (level 4 alone). A rare
  long one may be cut (23 of the 4000 level 1-3 ones at grpo's 48)."""
  from rlreason.data import sources as data_lib
  from rlreason.train import loaders
  from rlreason.train import sft

  lengths, checked = {}, set()
  for name, claim in sorted(reproduce.CLAIMS.items()):
    for testbed in claim.testbeds:
      for label in claim.variants:
        if (name, label) in CUT_BY_DESIGN:
          continue
        module_name, overrides = claim.overrides(label, testbed)
        _, cfg = reproduce._config(module_name, overrides, 0, 0, testbed)
        key = (cfg.model, cfg.data, cfg.template)
        if key not in lengths:
          _, completions = sft.encode_pairs(
            loaders.load_tokenizer(cfg),
            cfg.template,
            data_lib.load(cfg.data, "train"),
          )
          lengths[key] = list(map(len, completions))
        cut = sum(n > cfg.max_new_tokens for n in lengths[key])
        assert cut <= 0.01 * len(lengths[key]), (
          name,
          testbed,
          label,
          cut,
          len(lengths[key]),
          cfg.max_new_tokens,
        )
        checked.add(name)
  assert {"simplerl_zoo", "adacl", "dump", "logic_rl"} <= checked


def test_the_readmes_status_table_names_every_claim_once_and_adds_up():
  """experiments/README.md's "Status at a glance": one row per claim in
  CLAIMS (none missing, none unknown), each with a verdict on both
  testbeds ("-" where not run), and the tallies under it are the table's."""
  path = os.path.join(os.path.dirname(reproduce.__file__), "README.md")
  text = open(path).read()
  table = text.split("### Status at a glance", 1)[1].split("\n\n", 3)[2]
  rows = [line.split(" | ") for line in table.splitlines()[2:]]
  names = [r[0].lstrip("| ") for r in rows]
  assert sorted(names) == sorted(reproduce.CLAIMS), set(names) ^ set(
    reproduce.CLAIMS
  )
  assert all(len(r) == 3 and r[1] and r[2].rstrip(" |") for r in rows), rows
  # The tallies below it count the table's verdicts by their first words.
  kinds = ("reproduces", "in direction", "partly", "does not", "not testable")
  counts = [collections.Counter(), collections.Counter()]
  for r in rows:
    for c, cell in zip(counts, (r[1], r[2].rstrip(" |"))):
      c[next((k for k in kinds if cell.startswith(k)), cell)] += 1
  words = {
    "reproduce": "reproduces",
    "do not reproduce": "does not",
    "not run": "-",
  }
  tallies = text.split("In all, on base v2:", 1)[1].split(".\n", 1)[0]
  base, tiny = " ".join(tallies.split()).split("; on the tiny testbed: ")
  for c, said in zip(counts[::-1], (base, tiny)):
    items = [item.split(" ", 1) for item in said.strip().split(", ")]
    got = {words.get(what, what): int(n) for n, what in items}
    assert got == dict(c), (got, dict(c))


def test_every_absent_means_names_a_field_and_a_runnable_other_value():
  """Config.absent_means (run_info.differences) of every claim's
  experiments: each key a field of its Config, each value unlike the
  field's default (or it would change nothing) and one a run can take
  (the old behaviour is still a flag)."""
  import importlib

  names = {m for c in reproduce.CLAIMS.values() for m, _ in c.variants.values()}
  found = 0
  for name in sorted(names):
    klass = importlib.import_module(f"experiments.{name}").Config
    fields = {f.name: f.default for f in dataclasses.fields(klass)}
    for key, value in vars(klass).get("absent_means", {}).items():
      assert key in fields, (name, key)
      assert value != fields[key], (name, key, value)
      dataclasses.replace(klass(), **{key: value}).validate()
      found += 1
  assert found >= 8, found  # dapo 1, rlpr 4, rm_grpo 1, adacl 1, knowrl 1
