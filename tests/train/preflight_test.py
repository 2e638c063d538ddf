"""Bad input fails before any compute, with one message naming the flag or
the file and row, and exit code 2 (flags.run_checked, as the CLI runs).

Each case runs the main job (experiments.grpo) in-process with the warm
start and the model loading replaced by a tripwire: a message that came
after any compute would show up as the tripwire's error instead.
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from experiments import grpo
from rlreason import config
from rlreason.train import context
from rlreason.train import flags
from rlreason.train import loaders
from rlreason.train import preflight
from rlreason.train import run_info
from rlreason.train import sft


class ComputeRan(Exception):
  pass


@pytest.fixture
def no_compute(monkeypatch):
  def tripwire(*args, **kwargs):
    raise ComputeRan("compute started before the input was checked")

  monkeypatch.setattr(sft, "warm_start", tripwire)
  monkeypatch.setattr(loaders, "load_model", tripwire)


def _cfg(tmp_path, **kw):
  return dataclasses.replace(
    grpo.TinyConfig(),
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
    **kw,
  )


def _fails(cfg, capsys, *expected):
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_USAGE
  err = capsys.readouterr().err
  for text in expected:
    assert text in err, err
  return err


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(log_every=0), "Invalid config: --log_every=0 must be >= 1"),
    (dict(eval_size=0), "Invalid config: --eval_size=0 must be >= 1"),
    (
      dict(keep_checkpoints=0),
      "Invalid config: --keep_checkpoints=0 must be >= 1",
    ),
    (dict(checkpoint_every=-1), "--checkpoint_every=-1 must be >= 0"),
    (dict(lr=-1.0), "--lr=-1.0 must be >= 0"),
    (dict(stop_after_hours=-2.0), "--stop_after_hours=-2.0 must be >= 0"),
    (dict(dtype="fp8"), "--dtype='fp8'; expected one of"),
    (dict(adam_b2=1.0), "--adam_b2=1.0 not in [0, 1)"),
    (dict(template="nope"), "--template='nope'; expected one of ('plain',"),
  ],
)
def test_a_flag_out_of_range(tmp_path, capsys, no_compute, overrides, message):
  _fails(_cfg(tmp_path, **overrides), capsys, message)
  assert not os.path.exists(tmp_path / "run")


def test_every_problem_is_reported_at_once(tmp_path, capsys, no_compute):
  err = _fails(
    _cfg(tmp_path, log_every=0, eval_size=0),
    capsys,
    "--log_every=0",
    "--eval_size=0",
  )
  assert err.count("Invalid config:") == 2


def test_a_prompt_over_the_budget_names_file_and_row(
  tmp_path, capsys, no_compute
):
  path = tmp_path / "rows.jsonl"
  rows = [{"question": "1+1=?", "answer": "2"}] * 30
  rows[24] = {"question": "1+" * 100 + "1=?", "answer": "101"}
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  _fails(
    _cfg(tmp_path, data=str(path), eval_data=str(path)),
    capsys,
    f"{path}: row 24 (line 25): the prompt has",
    "more than --max_prompt_len=32",
    "--truncate_prompts",
  )


def test_truncate_prompts_counts_instead(tmp_path):
  from rlreason.data import sources
  from rlreason.model import tokenizer

  cfg = _cfg(tmp_path, truncate_prompts=True, max_prompt_len=8)
  examples = [
    sources.Example("r0", "1+1=?", "2"),
    sources.Example("r1", "1+" * 20, "21"),
  ]
  tok = tokenizer.load("char")
  assert preflight.check_prompts(cfg, tok, examples, "--data") == 1
  ids = context.prompt_ids(tok, examples, cfg.template, max_len=8)
  assert [len(x) for x in ids] == [len(ids[0]), 8]
  full = context.prompt_ids(tok, examples, cfg.template, max_len=None)[1]
  assert ids[1] == full[-8:]  # the prompt's end (and its template) is kept


def test_evaluating_on_training_rows_is_warned(tmp_path, caplog, no_compute):
  """Without --eval_data a data file is evaluated on its own first rows:
  the run says so before any compute, and not when they are held out."""
  rows = [{"question": f"{i}+1=?", "answer": str(i + 1)} for i in range(10)]
  files = {}
  for name, part in (
    ("train", rows[:6]),
    ("some", rows[4:8]),
    ("new", rows[6:]),
  ):
    files[name] = tmp_path / f"{name}.jsonl"
    files[name].write_text("".join(json.dumps(r) + "\n" for r in part))
  for eval_data, warned in (("", "4 of 4"), ("some", "2 of 4"), ("new", "")):
    caplog.clear()
    cfg = _cfg(
      tmp_path,
      data=str(files["train"]),
      eval_data=str(files[eval_data]) if eval_data else "",
      eval_size=4,
    )
    with pytest.raises(ComputeRan):
      flags.run_checked(grpo.run, cfg)
    if warned:
      assert (
        f"{warned} evaluation problems are also in --data={files['train']}: "
        "the evaluation is not held out" in caplog.text
      )
    else:
      assert "not held out" not in caplog.text


def test_validate_rows_checks_only_the_first_rows(tmp_path):
  from rlreason.data import sources
  from rlreason.model import tokenizer

  examples = [
    sources.Example("r0", "1+1=?", "2"),
    sources.Example("r1", "1+" * 50, "51"),
  ]
  tok = tokenizer.load("char")
  cfg = _cfg(tmp_path, validate_rows=1)
  assert preflight.check_prompts(cfg, tok, examples, "--data") == 0
  with pytest.raises(config.ConfigError, match="r1: the prompt has"):
    preflight.check_prompts(_cfg(tmp_path), tok, examples, "--data")


@pytest.mark.parametrize("flag", ["workdir", "cache_dir", "compile_cache"])
def test_an_unwritable_directory(tmp_path, capsys, no_compute, flag):
  cfg = dataclasses.replace(_cfg(tmp_path), **{flag: "/proc/rlreason-run"})
  _fails(cfg, capsys, f"--{flag}=/proc/rlreason-run is not a writable")


def test_a_missing_model(tmp_path, capsys, no_compute):
  _fails(
    _cfg(tmp_path, model=str(tmp_path / "nope")),
    capsys,
    f"--model={tmp_path / 'nope'}: neither a preset",
  )
  # The shipped base is found by name wherever the package is installed.
  cfg = _cfg(tmp_path, model="laptop-base")
  preflight.check_paths(cfg, cfg.workdir)


def test_init_from_names_what_it_cannot_start_from(
  tmp_path, capsys, no_compute
):
  """A run or an HF directory it cannot load is named before any compute
  (tests/eval/evaluate_test.py starts runs from a real run's checkpoints)."""
  run = tmp_path / "earlier"
  (run / "checkpoints").mkdir(parents=True)  # none saved
  (run / "config.json").write_text('{"class": "experiments.grpo.Config"}')
  for source in (run, run / "checkpoints"):
    _fails(
      _cfg(tmp_path, init_from=str(source)),
      capsys,
      f"--init_from={source}: RL workdir {run}: no checkpoints in",
    )
  _fails(
    _cfg(tmp_path, init_from=str(run / "checkpoints" / "40")),
    capsys,
    "40: no such step; saved steps: []",
  )
  unsaved = tmp_path / "unsaved"  # a run stopped before its first save
  unsaved.mkdir()
  (unsaved / "config.json").write_text('{"class": "experiments.grpo.Config"}')
  _fails(
    _cfg(tmp_path, init_from=str(unsaved)),
    capsys,
    f"RL workdir {unsaved} has no checkpoints",
  )
  (tmp_path / "empty").mkdir()
  _fails(
    _cfg(tmp_path, init_from=str(tmp_path / "empty")),
    capsys,
    "neither an RL workdir (no checkpoints/) nor a Hugging Face directory",
  )
  _fails(
    _cfg(tmp_path, init_from=str(tmp_path / "nope")),
    capsys,
    f"--init_from={tmp_path / 'nope'}: no such directory",
  )
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  (hf_dir / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
  assert preflight.init_from_problem(str(hf_dir)) is None


def test_an_empty_model_list_names_no_model(tmp_path):
  """ampo's --teachers= (its claim's grpo arm) loads no teacher: nothing
  to check (it once stopped that arm as "--teachers=: no such directory")."""
  from experiments import ampo

  for teachers in ("", "reference,"):
    cfg = dataclasses.replace(
      ampo.Config(),
      teachers=teachers,
      workdir=str(tmp_path / "run"),
      cache_dir=str(tmp_path / "cache"),
    )
    preflight.check_paths(cfg, cfg.workdir)


@pytest.mark.parametrize(
  "module, overrides, message",
  [
    ("kdrl", dict(teacher="/no/teacher"), "--teacher=/no/teacher: no such"),
    (
      "ampo",
      dict(teachers="reference,/no/a,warm_start"),
      "--teachers=/no/a: no such directory",
    ),
    (
      "rm_grpo",
      dict(rm_kind="judge", judge_model="/no/judge"),
      "--judge_model=/no/judge: no such directory",
    ),
    ("search_r1", dict(max_turns=0), "--max_turns=0 must be >= 1"),
    ("toolrl", dict(turn_tokens=0), "--turn_tokens=0 must be >= 1"),
    ("igpo", dict(obs_tokens=-1), "--obs_tokens=-1 must be >= 0"),
    ("search_r1", dict(data="task:nosuch"), "unknown task 'nosuch'"),
    # Experiments that warm-start (or train a reward model) themselves
    # before the loop check the loop's inputs first (preflight.check_run).
    ("ttrl", dict(data="task:nosuch"), "unknown task 'nosuch'"),
    ("ettrl", dict(workdir="/proc/x"), "--workdir=/proc/x is not"),
    ("simplerl_zoo", dict(data="task:nosuch"), "unknown task 'nosuch'"),
    ("rm_grpo", dict(mesh_data=3), "--mesh_data=3"),
    ("truncated_ppo", dict(workdir="/proc/x"), "--workdir=/proc/x is not"),
  ],
)
def test_another_model_or_an_episode_budget_is_checked_first(
  tmp_path, capsys, no_compute, module, overrides, message
):
  """A teacher, a judge (models an experiment loads besides the policy,
  config.BaseConfig.model_fields) or a multi-turn budget that cannot work
  fails before the warm start (it failed after it, minutes in)."""
  import importlib

  experiment = importlib.import_module(f"experiments.{module}")
  where = dict(workdir=str(tmp_path / "run"), cache_dir=str(tmp_path / "c"))
  cfg = dataclasses.replace(experiment.Config(), **{**where, **overrides})
  assert flags.run_checked(experiment.run, cfg) == flags.EXIT_USAGE
  assert message in capsys.readouterr().err


@pytest.mark.parametrize(
  "module, overrides, message",
  [
    ("dapo", dict(overlong_buffer=500), "--overlong_buffer=500 must be in"),
    ("dler", dict(max_sample_rounds=0), "--max_sample_rounds=0 must be"),
    ("laser", dict(length_reward_mode="x"), "--length_reward_mode='x'"),
    ("dars", dict(extra_schedule="x"), "--extra_schedule='x'"),
    ("treerl", dict(fork_at="x"), "--fork_at='x'; expected entropy or"),
    ("entropy_mechanism", dict(law_key="x"), "--law_key='x'"),
    ("lp_reg", dict(lp_neg_frac=2.0), "--lp_neg_frac=2.0 not in [0, 1]"),
    ("seele", dict(fixed_ratio=5.0), "--fixed_ratio=5.0: a hint ratio"),
    ("pope", dict(prefix_fraction=2.0), "--prefix_fraction=2.0 not in"),
    ("guide", dict(hint_points=-1), "--hint_points=-1 must be >= 0"),
    ("knowrl", dict(tolerance=-1.0), "--tolerance=-1.0 not in [0, 1]"),
    ("dump", dict(signal_window=0), "--signal_window=0 must be >= 1"),
    ("igpo", dict(turn_gamma=-1.0), "--turn_gamma=-1.0 not in [0, 1]"),
    ("igpo", dict(info_gain_norm="x"), "--info_gain_norm='x'; one of"),
    ("ampo", dict(replace=-1), "--replace=-1 must be >= 0"),
    ("entropy_advantage", dict(adv_entropy_kappa=0.0), "kappa=0.0 must"),
    ("ghpo", dict(hint_ratios="a,b"), "--hint_ratios='a,b': comma-sep"),
    ("rlpr", dict(std_filter_momentum=2.0), "--std_filter_momentum=2.0"),
    ("rlpr", dict(refill_rounds=0), "--refill_rounds=0 must be >= 1"),
    ("rm_grpo", dict(rm_batching="x"), "--rm_batching='x'; expected"),
    ("rm_grpo", dict(rm_schedule="linear"), "--rm_schedule='linear'"),
    ("rm_grpo", dict(rm_pairs_per_prompt=64), "--rm_pairs_per_prompt=64"),
    ("laser", dict(variant="x"), "laser, laser_d, laser_de"),
    ("gspo", dict(policy_loss="x"), "--policy_loss: Unknown policy loss"),
    ("grpo", dict(kl_estimator="x"), "--kl_estimator: Unknown KL"),
    # A plain ValueError from an experiment's validate is a usage error.
    ("kdrl", dict(kd_on="x"), "--kd_on='x': all or incorrect"),
    ("logic_rl", dict(curriculum="x"), "bad curriculum stage 'x'"),
  ],
)
def test_an_experiments_own_flags_are_checked_first(
  tmp_path, capsys, no_compute, module, overrides, message
):
  """Each experiment's own knobs out of range fail in validate() (exit 2,
  one line); before, these ran into the warm start (and failed there, at
  the end of the run, or not at all: an overlong buffer past the budget
  penalised every response)."""
  import importlib

  experiment = importlib.import_module(f"experiments.{module}")
  cfg = dataclasses.replace(
    experiment.Config(), workdir=str(tmp_path / "run"), **overrides
  )
  assert flags.run_checked(experiment.run, cfg) == flags.EXIT_USAGE
  assert message in capsys.readouterr().err


def test_a_judge_is_a_model_directory_not_a_run(tmp_path):
  run = tmp_path / "earlier"
  (run / "checkpoints").mkdir(parents=True)
  assert preflight.init_from_problem(str(run), "judge_model", runs=False) == (
    f"--judge_model={run}: an RL run; this flag takes a Hugging Face directory"
  )


def test_a_missing_optional_package(tmp_path, capsys, no_compute, monkeypatch):
  real = preflight.installed
  missing = {"wandb", "google.cloud.storage"}
  monkeypatch.setattr(
    preflight, "installed", lambda m: m not in missing and real(m)
  )
  monkeypatch.setattr(preflight, "_filesystem", lambda url: False)
  _fails(
    dataclasses.replace(
      _cfg(tmp_path),
      wandb_project="mine",
      workdir="gs://bucket/run",
      tensorboard=True,
    ),
    capsys,
    "--wandb_project=mine: the wandb package is not installed",
    "--workdir=gs://bucket/run: writing to a bucket needs gcsfs and "
    "google-cloud-storage",
  )
  monkeypatch.setattr(preflight, "installed", lambda m: True)
  monkeypatch.setattr(preflight, "_filesystem", lambda url: True)
  assert (
    preflight.package_problems(
      _cfg(tmp_path, wandb_project="mine"), "gs://bucket/run"
    )
    == []
  )
  assert real("json") and not real("google.nothing_here")
  # tests/train/workdir_test.py's gs:// is an fsspec memory filesystem.
  monkeypatch.undo()
  assert preflight._filesystem("memory://x")  # noqa: SLF001
  assert not preflight._filesystem("nosuchprotocol://x")  # noqa: SLF001


def test_a_mesh_over_more_devices_than_there_are(tmp_path, capsys, no_compute):
  _fails(
    _cfg(tmp_path, mesh_fsdp=16),
    capsys,
    "--mesh_data=1 --mesh_fsdp=16 --mesh_tensor=1: Mesh {'data': 1, "
    "'fsdp': 16, 'tensor': 1} needs 16 devices, 8 available",
  )


def test_a_batch_that_does_not_split_over_the_mesh(
  tmp_path, capsys, no_compute
):
  """Minibatches of 4 of the 128 rows over 8 batch shards, and a sampler
  tensor split of 3 over 8 devices: both named before the warm start (the
  TinyConfig's SFT) or the model."""
  cfg = _cfg(tmp_path, mesh_fsdp=-1, minibatches=32, rollout_tensor=3)
  assert cfg.num_sequences == 128 and cfg.warm_start_steps > 0
  _fails(
    cfg,
    capsys,
    "a minibatch of 4 sequences cannot be split over 8 batch shards",
    "--rollout_tensor=3 must divide the 8 devices",
  )


def test_critic_updates_that_do_not_split_over_the_mesh(
  tmp_path, capsys, no_compute
):
  """ppo --critic_minibatches=32: 4 of the 128 rows per critic update, over
  8 batch shards, named before the warm start or the model."""
  from experiments import ppo

  cfg = dataclasses.replace(
    ppo.Config(),
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
    mesh_fsdp=-1,
    critic_minibatches=32,
  )
  assert flags.run_checked(ppo.run, cfg) == flags.EXIT_USAGE
  err = capsys.readouterr().err
  assert (
    "--critic_minibatches=32 leaves 4 sequences per critic update, fewer "
    "than the 8 batch shards" in err
  ), err


def test_a_model_whose_state_cannot_fit(
  tmp_path, capsys, no_compute, monkeypatch
):
  """qwen2.5-1.5b (1,543,714,304 weights) on devices of 16 GiB in all:
  GRPO's float32 weights, their gradients (--grad_clip takes their norm
  with all of them held), Adam's moments and the float32 KL reference
  (28.8 GiB) cannot fit; its LoRA base (5.8 GiB) can, as can the laptop's
  model; a backend that says nothing of its memory is not checked."""
  monkeypatch.setattr(
    preflight.devices, "total_memory", lambda: (16 * 2**30, "test devices")
  )
  cfg = _cfg(tmp_path, model="qwen2.5-1.5b")
  assert cfg.needs_ref and cfg.grad_clip > 0
  model_cfg = loaders.model_config(cfg)
  n = 1_543_714_304  # Qwen2.5-1.5B's, qkv biases included
  _fails(
    cfg,
    capsys,
    "--model=qwen2.5-1.5b: 1.54B weights need at least 28.8 GiB for the "
    "weights, their gradients and Adam's two moments in float32, the KL "
    "reference in float32, more than the 16.0 GiB of test devices. Use a "
    "smaller model, LoRA (--lora_rank) or a larger slice",
  )
  bf16 = dataclasses.replace(model_cfg, dtype="bfloat16")
  for c, m, ref, want in (
    (cfg, model_cfg, True, 20 * n),
    (cfg, bf16, True, 18 * n),  # the reference in the compute dtype
    (cfg, model_cfg, False, 16 * n),
    (dataclasses.replace(cfg, grad_clip=0.0), model_cfg, False, 12 * n),
  ):
    assert preflight.state_bytes(c, m, needs_ref=ref)[:2] == (n, want)
  assert preflight.state_bytes(cfg, model_cfg, training=False)[:2] == (
    n,
    4 * n,
  )
  lora = _cfg(tmp_path, model="qwen2.5-1.5b", lora_rank=8)
  assert preflight.state_bytes(lora, model_cfg, needs_ref=True)[:2] == (
    n,
    4 * n,
  )
  preflight.check_memory(lora, model_cfg, needs_ref=True)
  small = _cfg(tmp_path)
  preflight.check_memory(small, loaders.model_config(small), needs_ref=True)
  monkeypatch.setattr(preflight.devices, "total_memory", lambda: (None, ""))
  preflight.check_memory(cfg, model_cfg, needs_ref=True)


def test_a_bad_task_option(tmp_path, capsys, no_compute):
  _fails(
    _cfg(tmp_path, data="task:arithmetic:difficulty=abc"),
    capsys,
    "difficulty=abc",
  )


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(reward="nosuch"), "error: --reward=nosuch: unknown reward 'nosuch'"),
    (
      dict(reward="task:nosuch"),
      "error: --reward=task:nosuch: unknown task 'nosuch'; known: ['addsub5'",
    ),
    (dict(data="task:nosuch"), "error: task:nosuch: unknown task 'nosuch'"),
  ],
)
def test_an_unknown_reward_or_task(
  tmp_path, capsys, no_compute, overrides, message
):
  _fails(_cfg(tmp_path, **overrides), capsys, message)


def test_resuming_with_other_settings_is_refused(tmp_path, capsys, no_compute):
  cfg = _cfg(tmp_path)
  os.makedirs(cfg.workdir)
  saved = {"class": run_info.class_name(cfg), **dataclasses.asdict(cfg)}
  with open(os.path.join(cfg.workdir, "config.json"), "w") as f:
    json.dump(saved, f)
  err = _fails(
    dataclasses.replace(cfg, lr=1e-2, group_size=4, steps=500),
    capsys,
    "holds a run with another config",
    "--lr: 0.0002 -> 0.01",
    "--group_size: 8 -> 4",
    "--allow_config_change",
  )
  assert "--steps" not in err  # steps may grow on resume


def test_every_resumable_change_is_a_field():
  fields = {f.name for f in dataclasses.fields(config.BaseConfig)}
  missing = set(run_info.RESUMABLE_CHANGES) - fields
  assert not missing, missing
  assert len(set(run_info.RESUMABLE_CHANGES)) == len(run_info.RESUMABLE_CHANGES)


def test_allow_config_change_records_it(tmp_path):
  cfg = _cfg(tmp_path)
  os.makedirs(cfg.workdir)
  saved = {"class": run_info.class_name(cfg), **dataclasses.asdict(cfg)}
  with open(os.path.join(cfg.workdir, "config.json"), "w") as f:
    json.dump(saved, f)
  preflight.check_resume(
    dataclasses.replace(cfg, lr=1e-2, allow_config_change=True), cfg.workdir
  )
  with open(os.path.join(cfg.workdir, "config_changes.jsonl")) as f:
    (record,) = [json.loads(line) for line in f]
  assert record["changes"] == {"lr": [2e-4, 1e-2]}


def test_the_cli_exits_2_with_one_message(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.grpo",
      "--log_every=0",
      f"--workdir={tmp_path / 'run'}",
      f"--cache_dir={tmp_path / 'cache'}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, "XLA_FLAGS": ""},
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "error: Invalid config: --log_every=0 must be >= 1" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(tmp_path / "cache")


def test_a_cli_run_records_its_module_by_name(monkeypatch):
  """`python -m experiments.grpo` runs the module as __main__ (its
  __spec__ names it): config.json says experiments.grpo.Config."""
  import importlib.machinery
  import sys

  cls = dataclasses.make_dataclass(
    "Config", [], bases=(config.BaseConfig,), frozen=True
  )
  cls.__module__ = "__main__"
  spec = importlib.machinery.ModuleSpec("experiments.grpo", None)
  monkeypatch.setattr(sys.modules["__main__"], "__spec__", spec)
  assert run_info.class_name(cls()) == "experiments.grpo.Config"
  monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
  assert run_info.class_name(cls()) == "__main__.Config"  # python grpo.py


def test_a_cli_run_and_an_imported_run_are_the_same_class():
  assert run_info.same_class("__main__.Config", "experiments.grpo.Config")
  assert not run_info.same_class(
    "experiments.dapo.Config", "experiments.grpo.Config"
  )
  assert not run_info.same_class("__main__.Config", "experiments.grpo.Other")


def test_running_out_of_device_memory_says_what_to_turn(tmp_path, capsys):
  """A run whose program runs out of device memory (here an allocation of
  1 PiB: past any host's address space, so it fails at once even where
  the kernel overcommits) exits 1 with the traceback, then one line:
  XLA's own, the knobs and the planner. Other runtime errors stay
  tracebacks."""
  import jax
  import jax.numpy as jnp

  def too_big(cfg):
    return jnp.zeros((1 << 48,), jnp.float32).block_until_ready()

  cfg = _cfg(tmp_path, micro_batches=2)
  assert flags.run_checked(too_big, cfg) == 1
  err = capsys.readouterr().err
  assert "Traceback" in err
  last = err.strip().splitlines()[-1]
  assert last.startswith(
    "error: out of device memory (RESOURCE_EXHAUSTED: Out of memory "
    "allocating 1125899906842624 bytes.). Turn: --micro_batches=4 "
  ), last
  assert "python -m experiments.plan" in last and "resume" in last

  def other(cfg):
    raise jax.errors.JaxRuntimeError("INTERNAL: something else")

  with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
    flags.run_checked(other, cfg)
