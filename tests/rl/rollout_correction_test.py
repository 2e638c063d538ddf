"""Rollout / trainer mismatch correction end to end on the tiny model:
bf16 rollouts of an fp32 trainer disagree with it token by token, the
metrics say so, and the importance weights enter the batch; fp32 rollouts
agree with the trainer."""

import dataclasses

import numpy as np
import pytest

from experiments import grpo
from rlreason import testing
from rlreason.data import sources as data_lib
from rlreason.rl import objective


def _batch(**overrides):
  cfg = grpo.TinyConfig(
    max_new_tokens=12,
    warm_start_steps=0,
    mesh_fsdp=1,
    group_size=4,
    kl_coef=0.0,
    **overrides,
  )
  ctx = testing.tiny_context(cfg)
  examples = data_lib.load("task:arithmetic:difficulty=1,n=4", "train")
  rollout = testing.tiny_rollout(ctx, examples)
  return objective.outcome_batch(rollout, examples, ctx)


@pytest.fixture(scope="module")
def bf16():
  return _batch(rollout_dtype="bfloat16", rollout_correction="tis")


def test_bf16_rollouts_show_a_mismatch_and_get_weights(bf16):
  batch, metrics = bf16
  m = batch["mask"] > 0
  assert metrics["mismatch/abs_log_ratio"] > 1e-4, metrics
  assert metrics["mismatch/k3_kl"] >= 0
  # old_logp is the trainer's now, sampler_logp the bf16 sampler's.
  gap = np.abs(batch["old_logp"][m] - batch["sampler_logp"][m])
  assert gap.max() > 1e-3, gap.max()
  w = batch["weight"]
  want = np.minimum(np.exp(batch["old_logp"] - batch["sampler_logp"]), 2.0)
  np.testing.assert_allclose(w[m], want[m], rtol=1e-5, atol=1e-6)
  assert (w[~m] == 0).all()


def test_fp32_rollouts_agree_with_the_trainer():
  batch, metrics = _batch(rollout_correction="mis")
  assert metrics["mismatch/abs_log_ratio"] < 1e-4, metrics
  assert metrics["mismatch/dropped"] == 0.0
  m = batch["mask"] > 0
  np.testing.assert_allclose(batch["weight"][m], 1.0, rtol=1e-4, atol=1e-4)


def test_off_by_default_keeps_the_sampler_logp():
  batch, metrics = _batch()
  assert batch["old_logp"] is batch["sampler_logp"]
  assert "weight" not in batch
  assert not any(k.startswith("mismatch/") for k in metrics)


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("rollout_correction", "is", "rollout_correction"),
    ("rollout_correction_level", "turn", "rollout_correction_level"),
    ("rollout_correction_cap", 1.0, "rollout_correction_cap"),
    ("rollout_dtype", "int8", "rollout_dtype"),
  ],
)
def test_bad_correction_settings_are_errors(field, value, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(grpo.TinyConfig(), **{field: value}).validate()


@pytest.mark.parametrize("name", ["ampo", "dars", "guide", "truncated_ppo"])
def test_experiments_with_their_own_batches_reject_it(name):
  """A make_batch that does not apply the correction: an error up front,
  not a silent no-op."""
  import importlib

  cfg = importlib.import_module(f"experiments.{name}").Config()
  cfg.validate()
  with pytest.raises(ValueError, match=f"experiments.{name}'s make_batch"):
    dataclasses.replace(cfg, rollout_correction="tis").validate()


def test_ppo_weights_its_batch(tmp_path):
  """ppo builds its own batch (critic values, GAE) and applies it too."""
  from experiments import ppo
  from rlreason import metrics as metrics_lib

  cfg = dataclasses.replace(
    ppo.Config(),
    **{**testing.SMOKE, "warm_start_steps": 0, "eval_size": 1, "steps": 1},
    rollout_dtype="bfloat16",
    rollout_correction="tis",
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  ppo.run(cfg)
  rows = metrics_lib.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  trained = [r for r in rows if "loss" in r]
  assert len(trained) == 1
  assert trained[0]["mismatch/abs_log_ratio"] > 1e-4, trained[0]


def test_the_loop_trains_with_the_correction_and_logs_it(tmp_path):
  """A 2-step grpo run with bf16 rollouts and masked IS: the weights go
  through the train step and the mismatch lands in metrics.jsonl."""
  import os

  from rlreason import metrics as metrics_lib

  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    **{**testing.SMOKE, "warm_start_steps": 0, "eval_size": 1},
    rollout_dtype="bfloat16",
    rollout_correction="mis",
    rollout_correction_level="sequence",
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  grpo.run(cfg)
  rows = metrics_lib.read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
  trained = [r for r in rows if "loss" in r]
  assert len(trained) == 2
  for r in trained:
    assert r["mismatch/abs_log_ratio"] > 1e-4, r
    assert 0 <= r["mismatch/dropped"] <= 1
    assert np.isfinite(r["loss"])
