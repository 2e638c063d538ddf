"""pass@k / maj@k / mean@k against hand-made cases."""

import json
import math
from itertools import combinations

import numpy as np
import pytest

from rlreason.sampling import scoring as evaluation


@pytest.mark.parametrize(
  "n,c,k",
  [
    (5, 2, 1),
    (5, 2, 2),
    (5, 2, 3),
    (10, 3, 4),
    (4, 0, 2),
    (4, 4, 1),
    (6, 5, 2),
  ],
)
def test_pass_at_k_closed_form_and_enumeration(n, c, k):
  closed = 1 - math.comb(n - c, k) / math.comb(n, k)
  # Enumerate every k-subset of n samples with the first c correct.
  subsets = list(combinations(range(n), k))
  enum = np.mean([any(i < c for i in s) for s in subsets])
  assert evaluation.pass_at_k(n, c, k) == pytest.approx(
    closed, rel=1e-12, abs=1e-12
  )
  assert evaluation.pass_at_k(n, c, k) == pytest.approx(
    enum, rel=1e-12, abs=1e-12
  )


def test_pass_at_k_hand_values_and_errors():
  assert evaluation.pass_at_k(4, 1, 1) == pytest.approx(
    0.25, rel=1e-9, abs=1e-12
  )
  # 1 - 3/6
  assert evaluation.pass_at_k(4, 1, 2) == pytest.approx(
    0.5, rel=1e-9, abs=1e-12
  )
  assert evaluation.pass_at_k(4, 2, 3) == 1.0  # n - c < k
  assert evaluation.pass_at_k(200, 1, 100) == pytest.approx(
    0.5, rel=1e-9, abs=1e-12
  )
  with pytest.raises(ValueError, match="1 <= k <= n"):
    evaluation.pass_at_k(3, 1, 4)


def test_majority_ties_are_deterministic():
  assert evaluation.majority(["7", "5", "5", "7"]) == "7"  # tie: first seen
  assert evaluation.majority(["5", "7", "7", "5"]) == "5"
  assert evaluation.majority([None, None, "3"]) == "3"
  assert evaluation.majority([None, None]) is None


def test_maj_at_k():
  answers = ["12", "11", "12", None, "11", "11"]
  correct = [True, False, True, False, False, False]
  assert evaluation.maj_at_k(answers, correct, 1) == 1.0
  assert evaluation.maj_at_k(answers, correct, 3) == 1.0  # 12 twice
  assert evaluation.maj_at_k(answers, correct, 4) == 1.0  # None abstains
  assert evaluation.maj_at_k(answers, correct, 5) == 1.0  # 2-2 tie -> "12"
  assert evaluation.maj_at_k(answers, correct, 6) == 0.0  # 11 wins 3-2
  assert evaluation.maj_at_k([None], [False], 1) == 0.0


def test_summarize_and_ci():
  correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
  s = evaluation.summarize(correct, ks=(1, 2))
  assert s["mean@1"][0] == pytest.approx(2 / 3, rel=1e-9, abs=1e-12)
  assert s["pass@1"][0] == pytest.approx(
    (0.25 + 1 + 0) / 3, rel=1e-9, abs=1e-12
  )
  assert s["pass@2"][0] == pytest.approx((0.5 + 1 + 0) / 3, rel=1e-9, abs=1e-12)
  m, lo, hi = evaluation.mean_ci([1.0] * 10)
  assert m == 1.0 and lo < 1.0 and hi == pytest.approx(1.0, rel=1e-9, abs=1e-12)
  table = evaluation.markdown_table({"after": s})
  assert "| after | " in table and "pass@2" in table


def _fake_ctx(budget=0, calls=None):
  """A context whose sampler answers "4" to every prompt."""
  import types

  def generate(params, chunk, rng, step, **kw):
    if calls is not None:
      calls.append(kw["max_new_tokens"])
    n = len(chunk) * kw["group_size"]
    return types.SimpleNamespace(
      texts=["4"] * n,
      prompt_ids=np.repeat(np.arange(len(chunk)), kw["group_size"]),
    )

  return types.SimpleNamespace(
    cfg=types.SimpleNamespace(eval_max_new_tokens=budget),
    generate=generate,
    correct_fn=lambda texts, gold: [t == g for t, g in zip(texts, gold)],
  )


def test_an_interrupted_evaluation_resumes_from_its_journal(tmp_path):
  """Each finished chunk's problems are in the journal; a rerun samples
  only the rest (from their own rows) and scores as one uninterrupted
  call; a torn last line is dropped and its problem sampled again."""
  problems = _problems("4", "5", "4", "4", "4")
  journal = str(tmp_path / "greedy.jsonl")
  seen = []

  def ctx(fail_at=None):
    fake = _fake_ctx()
    generate = fake.generate

    def counted(params, chunk, rng, step, **kw):
      if len(seen) == fail_at:
        raise KeyboardInterrupt
      seen.append(kw["row_offset"])
      return generate(params, chunk, rng, step, **kw)

    fake.generate = counted
    return fake

  def score(fake, **kw):
    return evaluation.sample_and_score(
      fake, None, problems, step=0, sequences_per_call=2, **kw
    )

  whole = score(ctx())
  seen.clear()
  with pytest.raises(KeyboardInterrupt):
    score(ctx(fail_at=2), journal=journal)  # chunks of rows 0-1 and 2-3
  assert seen == [0, 2]
  lines = open(journal).read().splitlines()
  assert [json.loads(x) for x in lines[:2]] == [
    {"texts": ["4"], "correct": [1.0]},
    {"texts": ["4"], "correct": [0.0]},
  ]
  with open(journal, "w") as f:  # died writing row 3's line
    f.write("\n".join(lines[:3]) + "\n" + lines[3][:5])
  seen.clear()
  resumed = score(ctx(), journal=journal)
  assert seen == [3]  # rows 3 and 4
  assert resumed.texts == whole.texts
  np.testing.assert_array_equal(resumed.correct, whole.correct)
  assert len(open(journal).read().splitlines()) == 5
  with pytest.raises(ValueError, match="holds 5 problems, more than the 2"):
    evaluation.sample_and_score(
      ctx(), None, problems[:2], step=0, journal=journal
    )


def test_an_interrupt_stops_the_evaluation_after_its_chunk(tmp_path):
  """ctx.interrupt is called after each chunk but the last, once the
  journal holds the chunk; raising there stops the evaluation, and the
  next call scores the rest."""
  problems = _problems("4", "5", "4", "4", "4")
  journal = str(tmp_path / "greedy.jsonl")

  class Stop(BaseException):
    pass

  checks = []

  def interrupt():
    checks.append(len(open(journal).read().splitlines()))
    if len(checks) == 2:
      raise Stop

  ctx = _fake_ctx()
  ctx.interrupt = interrupt
  with pytest.raises(Stop):
    evaluation.sample_and_score(
      ctx, None, problems, step=0, sequences_per_call=2, journal=journal
    )
  assert checks == [2, 4]  # chunks of rows 0-1, 2-3
  done = evaluation.sample_and_score(
    ctx, None, problems, step=0, sequences_per_call=2, journal=journal
  )
  assert checks == [2, 4]  # the last chunk: no call
  np.testing.assert_array_equal(done.correct, [[1], [0], [1], [1], [1]])


def _problems(*answers):
  import types

  return [types.SimpleNamespace(answer=a) for a in answers]


@pytest.mark.parametrize("budget,expected", [(0, None), (7, 7)])
def test_sample_and_score_passes_the_eval_budget(budget, expected):
  """--eval_max_new_tokens reaches the sampler (0: the training budget)."""
  calls = []
  ctx = _fake_ctx(budget, calls)
  got = evaluation.sample_and_score(ctx, None, _problems("4", "5"), step=0)
  assert calls == [expected]
  np.testing.assert_array_equal(got.correct[:, 0], [True, False])


def test_a_long_evaluation_shows_its_progress(capsys):
  """A line per chunk at most every progress_every seconds, none after the
  last chunk (the caller reports the result); a short one prints none."""
  problems = _problems("4", "5", "4", "4", "4")
  for every, expected in ((30.0, []), (0.0, ["2/5", "4/5"])):
    evaluation.sample_and_score(
      _fake_ctx(),
      None,
      problems,
      step=0,
      sequences_per_call=2,
      progress_every=every,
    )
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
      f"eval problems {n}" for n in expected
    ]
    if expected:
      assert lines[0].split(" | ")[1] == "accuracy 0.500"  # "4" right of 2
      assert lines[1].split(" | ")[1] == "accuracy 0.750"


def test_a_long_chunk_shows_its_progress_from_the_sampler(capsys):
  """Within a chunk, the sampler's reports of rows sampled (here 2 and 6 of
  a chunk's 8: 4 samples of 2 problems; 2 of the last chunk's 4) show as
  problems done."""
  problems = _problems("4", "5", "4", "4", "4")
  fake = _fake_ctx()
  generate = fake.generate

  def reporting(params, chunk, rng, step, **kw):
    for rows in (2, 6):
      if rows < len(chunk) * kw["group_size"]:  # none for the last call
        kw["progress"](rows)
    return generate(params, chunk, rng, step, **kw)

  fake.generate = reporting
  evaluation.sample_and_score(
    fake, None, problems, step=0, samples=4, sequences_per_call=8,
    progress_every=0.0,
  )  # fmt: skip
  lines = capsys.readouterr().err.splitlines()
  assert [line.split(" | ")[0] for line in lines] == [
    f"eval problems {n}/5"
    for n in (0, 1, 2, 2, 3, 4, 4)  # chunks of 2, 2 and 1 problems
  ]


def test_sampled_eval_does_not_depend_on_the_chunk_size():
  """Variants of a claim with other batch shapes (B * G) evaluate one warm
  start alike: each chunk samples with its rows' global keys."""
  from experiments import grpo
  from rlreason.data import sources as data_lib
  from rlreason import testing

  cfg = grpo.TinyConfig(max_new_tokens=8, warm_start_steps=0, mesh_fsdp=1)
  ctx = testing.tiny_context(cfg)
  examples = data_lib.load("task:arithmetic:difficulty=1,n=4", "eval")
  scored = [
    evaluation.sample_and_score(
      ctx, ctx.params, examples, step=3, samples=3, sequences_per_call=n
    )
    for n in (3, 6, 12)  # 1, 2 and 4 prompts per call
  ]
  for other in scored[1:]:
    assert other.texts == scored[0].texts
  assert len({t for row in scored[0].texts for t in row}) > 4  # sampled
