"""Warm-start demonstrations and rejection sampling for expert iteration."""

import dataclasses

import numpy as np
import pytest

from rlreason.data import sources as data_lib
from rlreason.guidance import hints
from rlreason.train import sft
from rlreason.model import tokenizer as tokenizer_lib

TOK = tokenizer_lib.load("char")


@pytest.fixture(scope="module")
def examples():
  return data_lib.load("task:arithmetic:difficulty=2,n=200", "train")


def test_off_by_one():
  assert sft.off_by_one("2+3\n=5\nanswer: 5") == "2+3\n=5\nanswer: 6"
  assert sft.off_by_one("answer: -1") == "answer: 0"
  tagged = "<think>\n7-5\n=2\n</think>\n<answer>2</answer>"
  assert sft.off_by_one(tagged) == tagged.replace(">2<", ">3<")
  for text in ("answer: x", "<answer>Riga</answer>", "no answer line"):
    assert sft.off_by_one(text) == text


def test_encode_pairs_plain_and_noisy(examples):
  prompts, completions = sft.encode_pairs(TOK, "plain", examples[:3])
  for e, p, c in zip(examples, prompts, completions):
    assert TOK.decode(p) == e.question
    assert c == TOK.encode(e.solution) + [TOK.eos_id]
  # Off-by-one demonstrations: the ones a seeded uniform draw puts < noise.
  _, noisy = sft.encode_pairs(TOK, "plain", examples, noise=0.5, seed=3)
  bad = np.random.default_rng(3).random(len(examples)) < 0.5
  for e, c, b in zip(examples, noisy, bad):
    solution = sft.off_by_one(e.solution) if b else e.solution
    assert TOK.decode(c[:-1]) == solution


def test_encode_pairs_hints_show_knowledge_or_an_expert(examples):
  plain, completions = sft.encode_pairs(TOK, "plain", examples, noise=0.5)
  prompts, hinted_completions = sft.encode_pairs(
    TOK, "plain", examples, noise=0.5, hints=0.5, max_prompt_len=80
  )
  for p, q, c, h, e in zip(
    prompts, plain, completions, hinted_completions, examples
  ):  # the same demonstrations, the hinted ones exact
    assert h == (c if p == q else TOK.encode(e.solution) + [TOK.eos_id])
  kinds = {"none": 0, "knowledge": 0, "expert": 0}
  for e, p, q in zip(examples, prompts, plain):
    assert len(p) <= 80
    text = TOK.decode(p)
    assert text.endswith(e.question)
    if p == q:
      kinds["none"] += 1
      continue
    hint = text[: -len(e.question) - 1]
    if hint.startswith(hints.EXPERT_PREFIX):
      kinds["expert"] += 1
      assert hint == hints.expert_hint(e.solution)
    else:
      kinds["knowledge"] += 1
      points = hint.removeprefix(hints.HINT_PREFIX).split("; ")
      assert tuple(points) == e.knowledge[: len(points)]
  # About half hinted, both kinds.
  assert 60 <= kinds["none"] <= 140, kinds
  assert kinds["knowledge"] > 20 and kinds["expert"] > 20, kinds
  # A budget no hint fits in: plain prompts.
  tight = max(len(p) for p in plain)
  short, _ = sft.encode_pairs(
    TOK, "plain", examples, hints=1.0, max_prompt_len=tight
  )
  assert all(len(p) <= tight for p in short)


def test_rejection_sampled_keeps_correct_distinct_samples_per_group():
  texts = ["a", "a", "b", "c", "a", "a", "x", "y"]
  correct = [1, 1, 1, 0, 1, 0, 0, 0]
  # Group 0 (a, a, b, c): first "a" and "b"; group 1 (a, a, x, y): first "a".
  np.testing.assert_array_equal(
    sft.rejection_sampled(correct, texts, 4), [1, 0, 1, 0, 1, 0, 0, 0]
  )
  np.testing.assert_array_equal(
    sft.rejection_sampled(correct, texts, 4, dedup=False),
    [1, 1, 1, 0, 1, 0, 0, 0],
  )
  # The same text in two groups is kept in each.
  np.testing.assert_array_equal(
    sft.rejection_sampled([1, 1], ["a", "a"], 1), [1, 1]
  )


def test_length_grouped_order_is_a_permutation_of_similar_lengths():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 200, size=1000)
  epoch = rng.permutation(1000)
  out = sft._length_grouped(epoch, lengths, 32, 8, np.random.default_rng(1))
  assert sorted(out.tolist()) == list(range(1000))
  spread = [np.ptp(lengths[out[i : i + 32]]) for i in range(0, 960, 32)]
  random_spread = [
    np.ptp(lengths[epoch[i : i + 32]]) for i in range(0, 960, 32)
  ]
  assert np.mean(spread) < np.mean(random_spread) / 4


def test_length_groups_keep_long_prompts_together():
  # 15% of prompts are long (hinted documents): grouped by prompt width
  # first, few batches are widened by one (padding.pad_prompts pads a batch
  # to its longest prompt's multiple of 32).
  rng = np.random.default_rng(0)
  prompts = [[1] * (70 if rng.random() < 0.15 else 8) for _ in range(2048)]
  lengths = rng.integers(10, 150, size=2048)
  keys = sft._group_key(prompts, lengths, 256)
  out = sft._length_grouped(
    rng.permutation(2048), keys, 32, 64, np.random.default_rng(1)
  )
  assert sorted(out.tolist()) == list(range(2048))
  wide = [
    any(len(prompts[i]) > 32 for i in out[b : b + 32])
    for b in range(0, 2048, 32)
  ]
  long_share = np.mean([len(p) > 32 for p in prompts])
  # Mixed by completion length alone, nearly every batch would be wide.
  assert np.mean(wide) <= long_share + 2 / 64
  np.testing.assert_array_equal(
    sft._group_key([[1] * 33, [1] * 5], np.array([7, 300]), 256),
    [2 * 257 + 7, 1 * 257 + 256],
  )


def test_the_warm_start_says_how_many_demonstrations_it_cuts(
  monkeypatch, tmp_path, capsys
):
  """2-hop kbqa solutions are 110-117 characters (+ EOS): all 6 are cut at
  64 completion tokens, none at the episode's 176."""
  from experiments import igpo

  class Trained(Exception):
    pass

  def train_on_pairs(*args, **kwargs):
    raise Trained  # the count is printed before training

  monkeypatch.setattr(sft, "train_on_pairs", train_on_pairs)
  base = igpo.Config(
    data="task:kbqa:difficulty=2,n=6", warm_start_steps=1, workdir="w"
  )
  said = {}
  for t in (64, 176):
    with pytest.raises(Trained):
      sft.warm_start(
        dataclasses.replace(base, max_new_tokens=t), cache_dir=str(tmp_path)
      )
    said[t] = capsys.readouterr().out
  cut = "6 of 6 demonstrations are longer than its 64 completion tokens"
  assert cut + " and are cut" in said[64], said[64]
  assert "are cut" not in said[176], said[176]
