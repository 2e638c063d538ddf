"""Every experiment smoke-runs for 2 steps; the main job resumes exactly."""

import dataclasses
import importlib
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

import experiments
from rlreason import testing

# Small enough for seconds on CPU; keeps each method's algorithmic choices.
SMOKE = testing.SMOKE

EXPERIMENTS = sorted(
  m.name
  for m in pkgutil.iter_modules(experiments.__path__)
  if not m.ispkg and m.name not in ("reproduce", "evaluate", "claims")
)
# Smoke-run by their own tests below, which also make test_smoke's checks.
OWN_SMOKE_TEST = ("rm_grpo",)


def _check_smoke_run(module, tmp_path, out) -> list[dict]:
  """2 finite steps, the run's files, a valid paper preset; the train rows."""
  rows = [json.loads(line) for line in open(tmp_path / "run/metrics.jsonl")]
  train = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  assert all(np.isfinite(r["loss"]) for r in train)
  assert "eval/accuracy" in out
  for f in ("config.json", "COMMIT", "eval_before.json", "eval_after.json"):
    assert os.path.exists(tmp_path / "run" / f), f
  if hasattr(module, "PAPER"):  # --scale=paper must name real fields.
    dataclasses.replace(module.Config(), **module.PAPER).validate()
  return train


@pytest.mark.parametrize(
  "name", [n for n in EXPERIMENTS if n not in OWN_SMOKE_TEST]
)
def test_smoke(name, tmp_path):
  module = importlib.import_module(f"experiments.{name}")
  cfg = dataclasses.replace(
    module.Config(),
    **SMOKE,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  _check_smoke_run(module, tmp_path, module.run(cfg))


def test_rm_grpo_logs_proxy_and_gold_and_reuses_its_reward_model(tmp_path):
  from experiments import rm_grpo

  cfg = dataclasses.replace(
    rm_grpo.Config(),
    **SMOKE,
    rm_prompts=8,
    rm_samples=2,
    rm_steps=3,
    rm_weight=0.5,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  train = _check_smoke_run(rm_grpo, tmp_path, rm_grpo.run(cfg))
  for r in train:  # the proxy and the gold reward, every step
    assert np.isfinite(r["reward/rm"]) and 0 <= r["accuracy"] <= 1
    mixed = 0.5 * r["reward/rm"] + 0.5 * r["reward/verifier"]
    np.testing.assert_allclose(r["reward"], mixed, atol=1e-5)
  info = json.load(open(tmp_path / "run/reward_model.json"))
  assert info["sample_accuracy"] is not None and "heldout_pair_accuracy" in info
  (cached,) = [p for p in os.listdir(tmp_path / "cache") if p.startswith("rm-")]
  # A rerun loads the cached RM: with no context or policy to sample from,
  # retraining would fail.
  _, again = rm_grpo.cached_reward_model(
    rm_grpo.sft.warm_started(cfg), None, None
  )
  assert again == info and os.listdir(tmp_path / "cache").count(cached) == 1


def test_dars_b_smoke(tmp_path):
  from experiments import dars

  # The preset fills the fields left at their defaults; set ones win.
  cfg = dataclasses.replace(
    dars.Config(),
    **SMOKE,
    variant="dars_b",
    extra_groups=2,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  got = dars.with_variant(cfg)
  assert (got.batch_size, got.extra_groups) == (SMOKE["batch_size"], 2)
  assert (got.minibatches, got.ppo_epochs) == (1, 2)  # full batch, 2 epochs
  assert got.lr == dars.DARS_B["lr"] != dars.Config().lr
  paper = dataclasses.replace(dars.Config(), **dars.PAPER, scale="paper")
  big = dars.with_variant(dataclasses.replace(paper, variant="dars_b"))
  assert (big.batch_size, big.minibatches, big.ppo_epochs) == (3072, 1, 2)
  big.validate()
  dars.run(cfg)
  rows = [json.loads(line) for line in open(tmp_path / "run/metrics.jsonl")]
  train = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  assert all(np.isfinite(r["loss"]) for r in train)
  saved = json.load(open(tmp_path / "run/config.json"))
  assert (saved["variant"], saved["ppo_epochs"], saved["lr"]) == (
    "dars_b",
    2,
    dars.DARS_B["lr"],
  )


def _cmd(workdir, cache):
  flags = [f"--{k}={v}" for k, v in {**SMOKE, "steps": 4}.items()]
  return [
    sys.executable,
    "-m",
    "experiments.grpo",
    *flags,
    f"--workdir={workdir}",
    f"--cache_dir={cache}",
  ]


def _train_rows(workdir):
  """Last row per step, without wall-clock fields."""
  rows = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    r = json.loads(line)
    if "loss" in r:
      rows[r["step"]] = {
        k: v
        for k, v in r.items()
        if not k.startswith(("time", "tokens_per_sec"))
      }
  return rows


def _final_params(workdir):
  ckpt = ocp.CheckpointManager(
    os.path.join(workdir, "checkpoints"), item_names=("state", "meta")
  )
  state = ckpt.restore(
    4, args=ocp.args.Composite(state=ocp.args.StandardRestore())
  ).state
  return state[0] if isinstance(state, (list, tuple)) else state["params"]


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_bit_identically(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  cache = tmp_path / "cache"
  subprocess.run(
    _cmd(tmp_path / "a", cache),
    check=True,
    env=env,
    capture_output=True,
    timeout=600,
  )

  proc = subprocess.Popen(
    _cmd(tmp_path / "b", cache),
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 600
  while not os.path.exists(tmp_path / "b/checkpoints/2"):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  resumed = subprocess.run(
    _cmd(tmp_path / "b", cache),
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]

  a, b = _train_rows(tmp_path / "a"), _train_rows(tmp_path / "b")
  assert sorted(a) == sorted(b) == [1, 2, 3, 4]
  assert a == b
  pa, pb = _final_params(tmp_path / "a"), _final_params(tmp_path / "b")
  import jax

  jax.tree.map(np.testing.assert_array_equal, pa, pb)
