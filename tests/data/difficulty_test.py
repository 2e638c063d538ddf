"""Hand-computed tests of rlreason/data/difficulty.py."""

import json
import math

import numpy as np
import pytest

from rlreason.data import sources as data_lib
from rlreason.data import difficulty


def _examples(n=6):
  return [
    data_lib.Example(f"t-d{1 + i % 2}-{i}", f"q{i}", "a") for i in range(n)
  ]


def test_default_source():
  assert difficulty.default_source("arithmetic-d2-0a1b") == "arithmetic-d2"
  assert difficulty.default_source("gsm8k:17") == "gsm8k"
  assert difficulty.default_source("x") == ""


def test_tracker_ema_counts_and_sources():
  t = difficulty.Tracker(decay=0.5)
  t.update(["a", "a", "b", "b"], [1, 0, 0, 0], signal=[1.0, 1.0, 0, 0])
  assert t.accuracy("a") == 0.5 and t.accuracy("b") == 0.0
  t.update(["a", "a"], [1, 1])
  # EMA: 0.5 * 0.5 + 0.5 * 1.0.
  assert t.accuracy("a") == 0.75
  assert t.attempts("a") == 4
  assert math.isnan(t.accuracy("c"))
  np.testing.assert_array_equal(t.accuracies(["a", "c"], -1), [0.75, -1])
  t2 = difficulty.Tracker(source_of=lambda u: "s")
  t2.update(["a", "a", "b", "b"], [1, 0, 0, 0], signal=[2.0, 0.0, 1, 1])
  n, acc, sig = t2.source_stats("s")
  # 4 samples; 1 of 4 correct; window mean of the samples' signals.
  assert (n, acc, sig) == (4, 0.25, 1.0)
  t3 = difficulty.Tracker(source_of=lambda u: "s", window=3)
  t3.update(["a", "a", "b", "b"], [1, 0, 0, 0], signal=[4.0, 0.0, 1, 2])
  assert t3.source_stats("s")[2] == 1.0  # the last 3 samples: 0, 1, 2
  assert t2.source_stats("none")[0] == 0


def test_tracker_state_is_json_and_restores():
  t = difficulty.Tracker(window=2)
  t.update(["x-1", "x-1"], [1, 0], signal=[0.5, 0.5])
  t.update(["x-2"], [1], signal=[1.0])
  t.update(["x-3"], [0], signal=[0.0])
  t.note("x-1", "irt", [[0.5, 1.0, 2]])
  state = json.loads(json.dumps(t.state()))
  u = difficulty.Tracker(window=2)
  u.restore(state)
  assert u.state() == t.state()
  assert u.notes("x-1", "irt") == [[0.5, 1.0, 2]]
  assert list(u.signals["x"]) == [1.0, 0.0]  # window of 2


def test_target_and_skip_weights():
  t = difficulty.Tracker(decay=0.0)
  ex = _examples(3)
  t.update([ex[0].uid] * 2, [1, 1])
  t.update([ex[1].uid] * 2, [1, 0])
  w = difficulty.target_weights(0.5, 0.5, unseen=0.3)(t, ex)
  np.testing.assert_allclose(w, [np.exp(-1.0), 1.0, 0.3], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(difficulty.skip_solved()(t, ex), [0, 1, 1])
  # Source prior: ex[2] (source t-d1, like ex[0]) takes its source's mean
  # accuracy, 1.0; a prompt of an unseen source keeps `unseen`.
  t3 = difficulty.Tracker(decay=0.0)
  t3.update([ex[0].uid] * 2, [1, 1])
  w = difficulty.target_weights(0.5, 0.5, 0.3, source_prior=True)(t3, ex)
  np.testing.assert_allclose(
    w, [np.exp(-1.0), 0.3, np.exp(-1.0)], rtol=1e-6, atol=1e-6
  )


def test_ucb_scores_and_probs():
  # total n = 4: bonus_j = sqrt(2 ln 5 / (n_j + 1)); unseen: signal 0.
  s = difficulty.ucb_scores([0.5, 0.2, np.nan], [1, 3, 0], c=1.0)
  np.testing.assert_allclose(
    s,
    [
      0.5 + np.sqrt(2 * np.log(5) / 2),
      0.2 + np.sqrt(2 * np.log(5) / 4),
      np.sqrt(2 * np.log(5)),
    ],
    rtol=1e-6,
    atol=1e-6,
  )
  # Before any sample every source scores sqrt(2 ln 2): uniform.
  s0 = difficulty.ucb_scores([np.nan] * 3, [0, 0, 0])
  np.testing.assert_allclose(
    difficulty.source_probs(s0, 0.1), [1 / 3] * 3, rtol=1e-6, atol=1e-7
  )
  inf = np.array([1.0, np.inf])
  np.testing.assert_array_equal(difficulty.source_probs(inf, 0.1), [0, 1])
  p = difficulty.source_probs(np.array([1.0, 0.0]), 1.0)
  np.testing.assert_allclose(
    p, [np.e / (1 + np.e), 1 / (1 + np.e)], rtol=1e-6, atol=1e-6
  )


def test_ucb_source_weights_spread_over_source():
  t = difficulty.Tracker(source_of=lambda u: u.split("-")[1])
  ex = _examples(6)  # sources d1 (3 prompts), d2 (3 prompts)
  t.update([ex[0].uid], [1], signal=[1.0])
  t.update([ex[1].uid], [1], signal=[0.0])
  w = difficulty.ucb_source_weights(c=0.0, temperature=1.0)(t, ex)
  p1 = np.e / (1 + np.e)
  np.testing.assert_allclose(w[0::2], p1 / 3, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(w[1::2], (1 - p1) / 3, rtol=1e-6, atol=1e-7)


def test_adaptive_prompts_deterministic_and_resumable():
  ex = _examples(6)
  weights = difficulty.skip_solved()

  def make():
    t = difficulty.Tracker()
    return difficulty.AdaptivePrompts(ex, 2, t, weights, seed=3)

  a = make()
  a.tracker.update([ex[0].uid], [1])  # solved: never drawn
  first = [next(a) for _ in range(3)]
  assert all(ex[0] not in b for b in first)
  assert all(len({e.uid for e in b}) == 2 for b in first)
  saved = json.loads(json.dumps(a.state()))
  rest = [next(a) for _ in range(3)]
  b = make()
  b.restore(saved)
  assert [next(b) for _ in range(3)] == rest


def test_tracked_iterator_checkpoints_tracker():
  class Cfg:
    batch_size, seed = 2, 0

  t = difficulty.Tracker()
  it = difficulty.tracked_iterator(t)(Cfg, _examples(4))
  next(it)
  t.update(["a"], [1])
  state = json.loads(json.dumps(it.state()))
  u = difficulty.Tracker()
  it2 = difficulty.tracked_iterator(u)(Cfg, _examples(4))
  it2.restore(state)
  assert u.accuracy("a") == 1.0 and next(it2) == next(it)


def test_bad_decay():
  with pytest.raises(ValueError):
    difficulty.Tracker(decay=1.0)
