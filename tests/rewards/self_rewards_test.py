"""Reward design, label-free and length-control building blocks (issue 9).

Hand-computed cases for rewards.semantic (EMPO), rewards.likelihood (RLPR),
label_free.vote_metrics (TTRL), format.logic_rl / format_gated,
objective.drop_groups (RLPR / EMPO filters),
length.laser_d_adaptive_targets (LASER-D), curriculum (Logic-RL), the
tagged task variants and self_scoring (RENT / RLPR policy scores).
"""

import json
import types

import jax
import numpy as np
import pytest

from rlreason.data import curriculum
from rlreason.rl import objective
from rlreason.model import policy
from rlreason import rewards
from rlreason.rewards import self_scoring
from rlreason.data import tasks
from rlreason.data.sources import Example
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rewards import format as format_lib
from rlreason.rewards import label_free
from rlreason.rewards import length
from rlreason.rewards import likelihood
from rlreason.rewards import math as math_lib
from rlreason.rewards import semantic
from rlreason.data.tasks import tagged

# ---------------------------------------------------------------- TTRL


def test_vote_metrics():
  votes = [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1]
  correct = [1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0]
  m = label_free.vote_metrics(votes, correct, 4)
  # Group 1's label is right; group 2 has no label; group 3's is wrong.
  assert m["label_accuracy"] == pytest.approx(1 / 3, rel=1e-6, abs=1e-6)
  assert m["reward_accuracy"] == pytest.approx(7 / 12, rel=1e-6, abs=1e-6)
  # 2 + 0 + 3 votes
  assert m["majority_ratio"] == pytest.approx(5 / 12, rel=1e-6, abs=1e-6)


# ---------------------------------------------------------------- EMPO


def test_semantic_clusters_exact_and_custom_equivalence():
  answers = ["2", " 2 ", None, "3"]
  ids = semantic.cluster_ids(answers, 4)
  # The missing answer is a cluster of its own (the authors' code).
  np.testing.assert_array_equal(ids, [0, 0, 1, 2])
  np.testing.assert_allclose(
    semantic.cluster_probabilities(ids, 4),
    [0.5, 0.5, 0.25, 0.25],
    rtol=1e-6,
    atol=1e-6,
  )
  # p = (1/2, 1/4, 1/4): H = -(.5 ln .5 + 2 * .25 ln .25) = 1.5 ln 2.
  np.testing.assert_allclose(
    semantic.semantic_entropy(ids, 4),
    [1.5 * np.log(2)],
    rtol=1e-6,
    atol=1e-6,
  )

  def all_same(pairs):
    return np.ones(len(pairs), bool)

  ids = semantic.cluster_ids(answers, 4, all_same)
  np.testing.assert_array_equal(ids, [0, 0, 1, 0])
  # Clusters of mass 3/4 and 1/4: no equivalence merges a missing answer.
  np.testing.assert_allclose(
    semantic.semantic_entropy(ids, 4),
    [-0.75 * np.log(0.75) - 0.25 * np.log(0.25)],
    rtol=1e-6,
    atol=1e-6,
  )
  # Two missing answers are two clusters; a group of them has H = ln G.
  ids = semantic.cluster_ids([None, None, "2", None], 4, all_same)
  np.testing.assert_array_equal(ids, [0, 1, 2, 3])
  np.testing.assert_allclose(
    semantic.semantic_entropy(ids, 4), [np.log(4)], rtol=1e-6, atol=1e-6
  )


def test_semantic_clusters_merge_transitively_per_group():
  same = {("a", "c"), ("b", "d"), ("c", "d")}

  def equivalent(pairs):
    return np.array([p in same or p[::-1] in same for p in pairs])

  ids = semantic.cluster_ids(
    ["a", "b", "c", "d", "a", "b", "x", "x"], 4, equivalent
  )
  # Group 1: a~c, b~d, c~d -> one cluster; group 2: a, b apart, x twice.
  np.testing.assert_array_equal(ids, [0, 0, 0, 0, 0, 1, 2, 2])
  r = rewards.get("semantic_cluster", group_size=2)(
    ["\\boxed{1}", "\\boxed{1}", "\\boxed{1}", "none"], None
  )
  np.testing.assert_allclose(r, [1.0, 1.0, 0.5, 0.5], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(
    semantic.entropy_band([0.0, 0.5, 1.0], low=0.1, high=1.0),
    [False, True, False],
  )


def test_math_equivalence_in_pool():
  pool = math_lib.make_pool(num_workers=1, timeout=20.0)
  try:
    same = semantic.math_equivalence([("1/2", "0.5"), ("2", "3")], pool=pool)
  finally:
    pool.close()
  np.testing.assert_array_equal(same, [True, False])


# ---------------------------------------------------------------- RLPR


def test_reference_probability_reward_and_std_filter():
  logp = np.log([[0.5, 0.25, 1.0], [1.0, 1.0, 1.0]])
  mask = [[1, 1, 0], [0, 0, 0]]
  np.testing.assert_allclose(
    likelihood.mean_token_prob(logp, mask), [0.375, 0.0], rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    likelihood.debiased([0.375, 0.2], [0.5, 0.1]),
    [0.0, 0.1],
    rtol=1e-6,
    atol=1e-7,
  )
  f = likelihood.StdFilter(momentum=0.5, scale=0.5, ema_start=2, filter_start=3)
  # Step 1: stds (population) 0.5, 0, 0.25: no filter before filter_start,
  # std 0 included (as the authors'); no average yet.
  np.testing.assert_array_equal(f([0, 1, 1, 1, 0, 0.5], 2), [True, True, True])
  assert f.ema is None and f.threshold == 0.0
  # Step 2 closes step 1 (before ema_start); its stds 0.2, 0.1 keep.
  np.testing.assert_array_equal(f([0, 0.4, 0, 0.2], 2), [True, True])
  assert f.ema is None
  # Step 3 closes step 2: 0.15 seeds the average, threshold 0.075: std 0.05
  # dropped, 0.1 kept ...
  np.testing.assert_array_equal(f([0, 0.1, 0, 0.2], 2), [False, True])
  assert f.ema == pytest.approx(0.15, rel=1e-6, abs=1e-6)
  assert f.threshold == pytest.approx(0.075, rel=1e-6, abs=1e-6)
  # ... and step 4 closes step 3: ema = 0.5 * 0.15 + 0.5 * 0.075.
  f([0, 1], 2)
  assert f.ema == pytest.approx(0.1125, rel=1e-6, abs=1e-6)


def test_std_filter_rounds_of_a_step_share_its_threshold_and_one_update():
  def filt():
    return likelihood.StdFilter(
      momentum=0.5, scale=1.0, ema_start=1, filter_start=2
    )

  f = filt()
  f([0, 0.4], 2, step=0)  # std 0.2
  f([0, 0.8], 2, step=0)  # std 0.4: the same step's second round
  # Step 1 opens: the average is the step's mean over both rounds, 0.3.
  np.testing.assert_array_equal(
    f([0, 0.5, 0, 0.7], 2, step=1), [False, True]
  )  # stds 0.25 < 0.3 <= 0.35
  assert f.ema == pytest.approx(0.3, rel=1e-6, abs=1e-6)
  kept = f([0, 0.62], 2, step=1)  # round 2 of step 1: threshold unchanged
  np.testing.assert_array_equal(kept, [True])  # 0.31 >= 0.3
  assert f.step == 1
  # A restored filter (a resumed run) goes on as this one does.
  g = filt()
  g.restore(json.loads(json.dumps(f.state())))
  for h in (f, g):
    h([0, 0.1], 2, step=2)
  assert g.ema == pytest.approx(f.ema, rel=1e-6, abs=1e-9)
  # Step 1's mean (0.25 + 0.35 + 0.31) / 3 entered the average.
  assert f.ema == pytest.approx(0.5 * 0.3 + 0.5 * 0.91 / 3, rel=1e-6, abs=1e-9)


# ---------------------------------------------------------------- format


def test_format_tags_is_rlprs_r1_check():
  texts = [
    "<think>a</think> b <answer>1</answer> c",  # text between and after
    "<think>a</think><answer>1</answer><answer>",  # a tag twice
    "x<think>a</think><answer>1</answer>",  # not at the start
    "<think>a<answer>1</answer></think>",  # out of order
    "a</think><answer></answer>",  # <think> prefilled; empty answer ok
  ]
  np.testing.assert_array_equal(format_lib.format_tags(texts[:4]), [1, 0, 0, 0])
  np.testing.assert_array_equal(
    format_lib.format_tags(texts[4:], prefilled="<think>"), [1]
  )


def test_repetition_counts_runs_of_words():
  from rlreason.rewards import repetition

  ten = " ".join(f"w{i}" for i in range(10))
  texts = [
    " ".join([ten] * 10),  # the same 10 words 10 times
    " ".join([ten] * 9),  # 9 times
    "_".join([ten] * 10),  # "_" splits words too
    "a b a b a b",
  ]
  np.testing.assert_array_equal(
    repetition.repeats(texts), [True, False, True, False]
  )
  np.testing.assert_array_equal(
    repetition.repeats(texts[3:], window=2, limit=3), [True]
  )
  assert not repetition.repeats([""]).any()


def test_loop_start_is_the_laser_authors_token_ngram_rule():
  from rlreason.rewards import repetition

  # m <= 8: never a loop, however repetitive.
  assert repetition.loop_start([1, 1, 1, 1, 1, 1, 1, 1]) == 8
  # m = 10, bigrams, m // 3 = 3: (1, 2) at 1 and 3 is 2 apart.
  assert repetition.loop_start([4, 1, 2, 1, 2, 5, 6, 7, 8, 9]) == 1
  # ... at 1 and 4 is 3 apart: not close enough; no 4-gram repeats.
  assert repetition.loop_start([4, 1, 2, 3, 1, 2, 6, 7, 8, 9]) == 10
  # m = 30, trigrams (m // 3 = 10): (7, 8, 9) at 20 and 25.
  row = list(range(100, 120)) + [7, 8, 9, 0, 1, 7, 8, 9, 2, 3]
  assert repetition.loop_start(row) == 20
  # Trigrams of one token are skipped: a run of 5s is no n-gram loop, but
  # scanning back, the 6-gram of 5s at 24 is seen again at 23 (the 2n test).
  row = list(range(100, 120)) + [5] * 10
  assert repetition.loop_start(row) == 23
  # m = 200, 4-grams seen 3 times: twice is not enough ...
  row = list(range(1000, 1200))
  row[10:14] = row[50:54] = [1, 2, 3, 4]
  assert repetition.loop_start(row) == 200
  row[90:94] = [1, 2, 3, 4]  # ... three times, 40 apart (< 66), is.
  assert repetition.loop_start(row) == 10
  np.testing.assert_array_equal(
    repetition.loops(
      [
        [4, 1, 2, 1, 2, 5, 6, 7, 8, 9, 0, 0],
        [4, 1, 2, 3, 1, 2, 6, 7, 8, 9, 1, 2],
      ],
      [10, 10],
    ),
    [True, False],  # the second's tail (1, 2) lies past its length
  )


def test_laser_exploration_pays_long_answered_wrong_responses_only():
  got = length.laser_exploration(
    [90, 90, 90, 90, 70, 90],
    [80, 80, 80, 80, 80, 100],
    correct=[0, 1, 0, 0, 0, 0],
    answered=[True, True, False, True, True, True],
    looping=[False, False, False, True, False, False],
    scale=0.5,
  )
  # earns / correct / no answer / loops / not longer / under its target
  np.testing.assert_array_equal(got, [0.5, 0, 0, 0, 0, 0])


def test_logic_rl_reward():
  check = tasks.get("knights").check
  good = "<think>x</think> <answer>A=K</answer>"
  completions = [
    good,  # format +1, right +2
    "<think>x</think> <answer>A=N</answer>",  # +1, wrong -1.5
    "A=K",  # -1, missing -2
    "so " + good,  # text before <think>: -1, unchecked -2
    "<think>x</think> <answer> </answer>",  # empty answer: -1 - 2
  ]
  r = rewards.get("logic_rl", check=check)(completions, ["A=K"] * 5)
  np.testing.assert_allclose(
    r, [3.0, -0.5, -3.0, -3.0, -3.0], rtol=1e-6, atol=1e-6
  )
  r = format_lib.logic_rl(
    ["x</think> <answer>A=K</answer>"],
    ["A=K"],
    check=check,
    prefilled="<think>",
  )
  np.testing.assert_allclose(r, [3.0], rtol=1e-6, atol=1e-6)


def test_think_block():
  np.testing.assert_array_equal(
    label_free.think_block(
      ["<think>a</think>", "</think><think>", "<think>", "x"]
    ),
    [1, 0, 0, 0],
  )


def test_format_gated():
  np.testing.assert_allclose(
    format_lib.format_gated([1, 0, 1], [1, 1, 0]),
    [1.0, 0.0, -1.0],
    rtol=1e-6,
    atol=1e-6,
  )


# ---------------------------------------------------------------- LASER-D


def test_laser_d_adaptive_targets():
  lengths = [10, 20, 30, 15, 5, 5, 7, 7, 45]
  correct = [1, 1, 1, 1, 0, 0, 0, 0, 0]
  # G = 3: n_easy = 2, n_medium = 1, n_hard = 1; the longest response is
  # 45. Easy prompt (lengths 10, 20, 30): coverage at 10 is 1/3
  # (floor(2/3) = 0), at 20 it is 2/3 (floor(4/3) = 1): 20. Medium (15, 5,
  # 5): coverage at 10 is 2/3, floor(2/3 * 1) = 0; at 20 all: 20. Hard (7,
  # 7, 45): coverage at 10 is 2/3, floor = 0; 20 and 30 the same; 50 is
  # not below the longest response: the target stays 45.
  targets = length.laser_d_adaptive_targets(
    lengths, correct, 3, [30, 10, 20, 50]
  )
  assert targets == {"easy": 20.0, "medium": 20.0, "hard": 45.0}
  np.testing.assert_array_equal(
    length.laser_d_bucket_targets(correct, 3, targets),
    [20, 20, 20, 20, 20, 20, 45, 45, 45],
  )
  # Wrong responses count in the coverage: an all-wrong hard prompt whose
  # responses are all short gets a tight target (coverage 1 at 5), the
  # easy one the longest response, 10.
  assert length.laser_d_adaptive_targets(
    [3, 4, 4, 10, 10, 10], [0, 0, 0, 1, 1, 1], 3, [5]
  ) == {"easy": 10.0, "medium": 10.0, "hard": 5.0}
  empty = length.laser_d_adaptive_targets([1, 2], [0, 0], 2, [1])
  assert empty == {"easy": 2.0, "medium": 2.0, "hard": 2.0}


# ---------------------------------------------------------------- curriculum


def _examples():
  return [
    Example(f"u{i}", f"q{i}", "a", difficulty=1 + i % 3) for i in range(12)
  ]


def test_curriculum_schedule_and_resume():
  assert curriculum.parse_schedule("40:2-3, 0:1") == [(0, (1, 1)), (40, (2, 3))]
  for bad in ("1:1", "0:1,0:2", "0:x", "0:3-1", ""):
    with pytest.raises(ValueError):
      curriculum.parse_schedule(bad)
  stages = curriculum.parse_schedule("0:1,2:2-3")
  it = curriculum.StagedPrompts(_examples(), 2, stages, seed=0)
  batches = [next(it) for _ in range(4)]
  assert [e.difficulty for b in batches[:2] for e in b] == [1] * 4
  assert all(e.difficulty in (2, 3) for b in batches[2:] for e in b)
  again = curriculum.StagedPrompts(_examples(), 2, stages, seed=0)
  again.restore(it.state())
  resumed = curriculum.StagedPrompts(_examples(), 2, stages, seed=0)
  for _ in range(4):
    next(resumed)
  assert [e.uid for e in next(again)] == [e.uid for e in next(resumed)]
  with pytest.raises(ValueError, match="difficulty 5-5"):
    curriculum.StagedPrompts(_examples(), 2, [(0, (5, 5))])


# ---------------------------------------------------------------- tasks


def test_tagged_tasks():
  tagged.register_all()
  tagged.register_all()  # idempotent
  task = tasks.get("knights_tags")
  p = task.generate(0, 1)
  inner = tasks.get("knights").generate(0, 1)
  assert p.prompt == inner.prompt and p.uid == inner.uid
  assert p.solution.startswith("<think>\n")
  assert p.solution.endswith(f"</think>\n<answer>{p.answer}</answer>")
  assert task.verify(p.solution, p.answer) == 1.0
  assert task.verify(inner.solution, p.answer) == 0.0  # no tag
  assert tagged.tagged_solution("7-5\n=2\nanswer: 2") == (
    "<think>\n7-5\n=2\n</think>\n<answer>2</answer>"
  )
  assert rewards.get("task:arithmetic_tags")(["<answer>2</answer>"], ["2"])[0]


# ---------------------------------------------------------------- scoring


def test_answer_spans_and_token_masks():
  tok = tokenizer_lib.load("char")
  texts = [
    "<think>\n1\n</think>\n<answer>12</answer>",
    "no answer",
    "1\nanswer: 7",
  ]
  spans = self_scoring.answer_char_spans(texts)
  assert spans == [(27, 29), None, (10, 11)]
  t = 40
  ids = np.zeros((3, t), np.int32)
  mask = np.zeros((3, t), np.float32)
  for i, text in enumerate(texts):
    row = tok.encode(text) + [tok.eos_id]
    ids[i, : len(row)] = row
    mask[i, : len(row)] = 1
  m = self_scoring.span_token_mask(ids, mask, spans, tok)
  np.testing.assert_array_equal(np.flatnonzero(m[0]), [27, 28])
  assert m[1].sum() == 0
  np.testing.assert_array_equal(np.flatnonzero(m[2]), [10])
  last = self_scoring.last_fraction_mask(
    np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]), 1 / 3
  )
  np.testing.assert_array_equal(last, [[0, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0]])


def test_answer_token_mask_falls_back_to_the_last_tokens():
  tok = tokenizer_lib.load("char")
  texts = ["1\nanswer: 7", "no answer!!"]
  p, t = 2, 16
  tokens = np.zeros((2, p + t), np.int32)
  mask = np.zeros((2, t), np.int32)
  for i, text in enumerate(texts):
    row = tok.encode(text) + [tok.eos_id]
    tokens[i, p : p + len(row)] = row
    mask[i, : len(row)] = 1
  rollout = types.SimpleNamespace(
    tokens=tokens, mask=mask, prompt_len=p, texts=texts
  )
  sel, has = self_scoring.answer_token_mask(
    rollout, tok, fallback_fraction=0.25
  )
  np.testing.assert_array_equal(has, [True, False])
  np.testing.assert_array_equal(np.flatnonzero(sel[0]), [10])
  # 12 tokens (11 characters + EOS): the last ceil(12 / 4) = 3.
  np.testing.assert_array_equal(np.flatnonzero(sel[1]), [9, 10, 11])


def test_reference_logprobs_match_a_full_forward():
  tok = tokenizer_lib.load("char")
  cfg = presets.get("tiny")
  params = transformer.init(cfg, jax.random.key(0))
  prompts = [tok.encode("1+2="), tok.encode("3*4-5=")]
  prefixes, refs = ["3\nanswer: ", ""], ["3", "7"]
  logp, mask = self_scoring.reference_logprobs(
    params, cfg, tok, prompts, prefixes, refs, temperature=0.7
  )
  np.testing.assert_array_equal(mask, [[1], [1]])
  for i in range(2):
    seq = prompts[i] + tok.encode(prefixes[i]) + tok.encode(refs[i])
    z = policy.logits(params, np.array([seq]), cfg)[0, -2] / 0.7
    want = jax.nn.log_softmax(z)[seq[-1]]
    np.testing.assert_allclose(logp[i, 0], want, rtol=1e-4, atol=1e-5)


def test_drop_groups_zeroes_mask_and_advantages():
  batch = {
    "mask": np.ones((4, 2), np.float32),
    "adv": np.array([1.0, -1.0, 2.0, -2.0], np.float32),
    "tokens": np.arange(8).reshape(4, 2),
  }
  out = objective.drop_groups(batch, np.array([False, True]), 2)
  np.testing.assert_array_equal(out["mask"], [[0, 0], [0, 0], [1, 1], [1, 1]])
  np.testing.assert_array_equal(out["adv"], [0, 0, 2, -2])
  np.testing.assert_array_equal(out["tokens"], batch["tokens"])
  token_adv = dict(batch, adv=np.ones((4, 2), np.float32))
  out = objective.drop_groups(token_adv, np.array([True, False]), 2)
  np.testing.assert_array_equal(out["adv"], [[1, 1], [1, 1], [0, 0], [0, 0]])
