"""DAPO dynamic sampling: group filter, refill rounds, weightless padding."""

import types

import numpy as np
import pytest

from rlreason.rl import dynamic_sampling as ds
from rlreason.data.sources import Example


def test_informative_groups():
  correct = np.array([1, 1, 0, 1, 0, 0, 1, 0])
  np.testing.assert_array_equal(
    ds.informative_groups(correct, 2), [False, True, False, True]
  )


def test_select_groups_and_concat_left_pads_prompts():
  a = {
    "tokens": np.arange(12).reshape(4, 3),
    "positions": np.ones((4, 3), np.int32),
    "mask": np.ones((4, 1)),
  }
  picked = ds.select_groups(a, np.array([1]), 2)
  np.testing.assert_array_equal(picked["tokens"], [[6, 7, 8], [9, 10, 11]])
  b = {
    "tokens": np.full((2, 4), 5),
    "positions": np.zeros((2, 4), np.int32),
    "mask": np.zeros((2, 1)),
  }
  out = ds.concat([picked, b], pad_id=0)
  np.testing.assert_array_equal(
    out["tokens"], [[0, 6, 7, 8], [0, 9, 10, 11], [5] * 4, [5] * 4]
  )
  np.testing.assert_array_equal(out["positions"][:2, 0], [-1, -1])
  assert out["mask"].shape == (4, 1)


def _ctx(rounds):
  """B = 2 prompts, G = 2; rounds[r] = (texts, prompt width P)."""

  def rollout_of(r):
    texts, width = rounds[r]
    return types.SimpleNamespace(
      texts=texts, prompt_ids=np.array([0, 0, 1, 1]), round=r, width=width
    )

  examples = [Example("a", "q", "1"), Example("b", "q", "1")]
  ctx = types.SimpleNamespace(
    cfg=types.SimpleNamespace(group_size=2),
    tokenizer=types.SimpleNamespace(pad_id=0),
    correct_fn=lambda texts, gold: [t == g for t, g in zip(texts, gold)],
    sample_more=lambda r: (rollout_of(r), examples),
  )
  return rollout_of(0), examples, ctx


def _make_batch(rollout, examples, ctx):
  n, p = 4, rollout.width
  batch = {
    "tokens": np.full(
      (n, p + 1), 10 * (rollout.round + 1) + np.arange(n)[:, None]
    ),
    "positions": np.zeros((n, p + 1), np.int32),
    "mask": np.ones((n, 1), np.float32),
    "adv": np.ones(n, np.float32),
  }
  return batch, {"accuracy": float(rollout.round)}


def test_refill_draws_more_rounds_until_b_informative_groups():
  rollout, examples, ctx = _ctx(
    [
      (["1", "1", "1", "2"], 1),  # group 0 all right; group 1 informative
      (["2", "1", "2", "2"], 2),  # group 0 informative; group 1 all wrong
    ]
  )
  fn = ds.refill(_make_batch, max_rounds=3)
  batch, m = fn(rollout, examples, ctx)
  # Round 0's rows 2, 3 (left padded to P = 2) then round 1's rows 0, 1.
  np.testing.assert_array_equal(batch["tokens"][:, -1], [12, 13, 20, 21])
  np.testing.assert_array_equal(batch["tokens"][:2, 0], [0, 0])
  np.testing.assert_array_equal(batch["mask"], np.ones((4, 1)))
  assert m["dynamic/rounds"] == 2
  assert m["dynamic/informative"] == 0.5
  assert m["dynamic/filled"] == 1.0
  assert m["accuracy"] == 0.5  # mean over the rounds' metrics


def test_refill_pads_with_weightless_groups_when_rounds_run_out():
  rollout, examples, ctx = _ctx([(["1", "1", "1", "2"], 1)])
  batch, m = ds.refill(_make_batch, max_rounds=1)(rollout, examples, ctx)
  # The informative group 1, then the filtered group 0 with no weight.
  np.testing.assert_array_equal(batch["tokens"][:, -1], [12, 13, 10, 11])
  np.testing.assert_array_equal(batch["mask"][:, 0], [1, 1, 0, 0])
  np.testing.assert_array_equal(batch["adv"], [1, 1, 0, 0])
  assert m["dynamic/filled"] == 0.5
  with pytest.raises(ValueError, match="max_rounds"):
    ds.refill(_make_batch, max_rounds=0)


def test_refill_by_another_rule_keeps_the_groups_make_batch_kept():
  """RLPR's rule: a make_batch that drops groups itself (mask zeroed) is
  refilled for them, whatever the verifier says."""
  rollout, examples, ctx = _ctx([(["1", "1", "1", "1"], 1), (["2"] * 4, 1)])

  def dropping(rollout, examples, ctx):  # drops group 0 of round 0
    batch, m = _make_batch(rollout, examples, ctx)
    if rollout.round == 0:
      batch["mask"][:2] = 0
    return batch, m

  fn = ds.refill(dropping, max_rounds=2, keep=ds.kept_groups)
  batch, m = fn(rollout, examples, ctx)
  # Round 0's group 1 (all right: DAPO's rule would drop it), then round
  # 1's group 0 (all wrong).
  np.testing.assert_array_equal(batch["tokens"][:, -1], [12, 13, 20, 21])
  np.testing.assert_array_equal(batch["mask"][:, 0], [1, 1, 1, 1])
  assert m["dynamic/rounds"] == 2 and m["dynamic/informative"] == 0.75


def test_refill_puts_back_the_kept_groups_past_the_batch():
  """With `put_back`, the last round's kept groups that the B do not take
  are handed back (their examples, in order) and counted; a round that
  fills the batch exactly, or no put_back, hands back none."""
  rollout, examples, ctx = _ctx(
    [
      (["1", "1", "1", "2"], 1),  # group 1 informative
      (["2", "1", "1", "2"], 1),  # both informative: one past the batch
    ]
  )
  back = []
  fn = ds.refill(_make_batch, max_rounds=3, put_back=back.extend)
  batch, m = fn(rollout, examples, ctx)
  np.testing.assert_array_equal(batch["tokens"][:, -1], [12, 13, 20, 21])
  assert back == [examples[1]] and m["dynamic/put_back"] == 0.5
  back.clear()
  rollout, examples, ctx = _ctx([(["1", "2", "2", "1"], 1)])  # both fill it
  _, m = fn(rollout, examples, ctx)
  assert back == [] and m["dynamic/put_back"] == 0.0
  _, m = ds.refill(_make_batch, max_rounds=3)(rollout, examples, ctx)
  assert "dynamic/put_back" not in m
