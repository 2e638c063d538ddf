"""The reward-model stage before the RL (train/reward_model.py)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from rlreason import testing
from rlreason.model import transformer
from rlreason.rewards import bradley_terry as bt
from rlreason.train import reward_model as rm_stage

CFG = testing.tiny_model_config()


def _cfg(**overrides):
  fields = dict(
    seed=0,
    rm_samples=2,
    rm_pairs_per_prompt=4,
    rm_heldout=0.25,
    rm_steps=2,
    rm_batch_size=4,
    rm_lr=1e-3,
    rm_micro_batches=1,
    rm_batching="prompt",
    rm_schedule="cosine",
    train_temp_budget_mib=0,
  )
  return types.SimpleNamespace(**{**fields, **overrides})


@pytest.mark.parametrize("batching", ["prompt", "pairs"])
def test_held_out_pairs_are_the_last_prompts_and_train_gets_the_rest(
  monkeypatch, batching
):
  """4 prompts x 2 samples, the first of each correct: one pair a prompt;
  rm_heldout 0.25 holds out the last prompt's pair. The Bradley-Terry
  training gets the other three pairs, in prompt order, with their prompts
  as groups under --rm_batching=prompt (none under pairs); the info counts
  them and scores the held-out pair."""
  rows, width = 8, 5
  tokens = np.arange(rows * width, dtype=np.int32).reshape(rows, width) % 50
  positions = np.tile(np.arange(width, dtype=np.int32), (rows, 1))
  correct = np.tile([1.0, 0.0], 4)
  monkeypatch.setattr(
    rm_stage,
    "kept_preference_data",
    lambda *a: (tokens, positions, correct, 4),
  )
  seen = {}

  def fake_train_bt(params, model_cfg, chosen, rejected, **kwargs):
    seen.update(chosen=chosen, rejected=rejected, **kwargs)
    return params, [0.7, 0.6]

  monkeypatch.setattr(bt, "train_bt", fake_train_bt)
  ctx = types.SimpleNamespace(model_cfg=CFG, score_rows=8, mesh=None)
  policy = transformer.init(CFG, jax.random.key(0))
  _, info = rm_stage.train_reward_model(_cfg(rm_batching=batching), ctx, policy)

  np.testing.assert_array_equal(seen["chosen"][0], tokens[[0, 2, 4]])
  np.testing.assert_array_equal(seen["rejected"][0], tokens[[1, 3, 5]])
  np.testing.assert_array_equal(seen["chosen"][1], positions[[0, 2, 4]])
  assert seen["schedule"] == "cosine" and seen["steps"] == 2
  if batching == "prompt":
    np.testing.assert_array_equal(seen["groups"], [0, 1, 2])
  else:
    assert seen["groups"] is None
  assert (info["pairs_train"], info["pairs_heldout"]) == (3, 1)
  # A zero head scores every row alike: each pair a tie, counted half.
  assert info["heldout_pair_accuracy"] == 0.5
  assert info["sample_accuracy"] == 0.5
  assert info["bt_loss_first"] == 0.7
  np.testing.assert_allclose(info["bt_loss_last"], 0.65, rtol=1e-6, atol=1e-9)


def test_the_cache_key_follows_every_setting_the_model_depends_on():
  """Two configs that differ in a setting of the reward model's (here the
  batching, the schedule) get different cache keys; the policy's RL
  settings do not enter it."""
  from experiments import rm_grpo

  key = lambda **kw: rm_stage.settings(
    dataclasses.replace(rm_grpo.Config(), **kw)
  )
  a = key()
  assert a == key(lr=3e-5) and "lr" not in a
  assert a != key(rm_batching="pairs")
  # The schedule enters the key where it is not the constant rate of the
  # models trained before it, whose keys stay valid.
  assert "rm_schedule" not in a and a != key(rm_schedule="cosine")
