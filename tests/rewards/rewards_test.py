"""Tests for rlreason.rewards (registry, math via the pool, format, length,
label-free rewards)."""

import os
import sys
import time

import numpy as np
import pytest

from rlreason import rewards
from rlreason.data import tasks
from rlreason.rewards import length
from rlreason.rewards import math as math_lib
from rlreason.rewards import pool as pool_lib

TIMEOUT = 5.0  # Generous: slow CI machines; the slowest pair takes ~0.2 s.


def _reaped(pid: int) -> bool:
  return not os.path.exists(f"/proc/{pid}")


@pytest.fixture(scope="module")
def pool():
  # Started once per module: workers import sympy/Math-Verify (~1 s).
  p = math_lib.make_pool(num_workers=2, timeout=TIMEOUT)
  yield p
  pids = p.pids()
  p.close()
  assert all(_reaped(pid) for pid in pids), "verifier workers leaked"


# (gold, prediction, equivalent under Math-Verify). Labels are the
# mathematically right ones except where a comment cites documented
# Math-Verify behaviour.
MATH_PAIRS = [
  # Fractions and decimals.
  ("\\frac{1}{2}", "0.5", True),
  ("1/2", "\\frac12", True),
  ("\\dfrac{3}{4}", "0.75", True),
  ("\\frac{3}{4}", "\\tfrac{6}{8}", True),
  ("-\\frac{2}{3}", "\\frac{-2}{3}", True),
  ("1.5", "\\frac{3}{2}", True),
  ("0.125", "1/8", True),
  ("\\frac{7}{2}", "3\\frac{1}{2}", True),
  ("1.50", "1.5", True),
  ("10^{-3}", "0.001", True),
  ("\\frac{1}{3}", "0.333", False),
  # verify(float_rounding=6) rounds floats to 6 decimals (documented in its
  # docstring), so 0.3333333 matches 1/3 though they differ mathematically.
  ("\\frac{1}{3}", "0.3333333", True),
  ("\\frac{2}{3}", "\\frac{3}{2}", False),
  ("0.1", "0.01", False),
  ("2", "2.0", True),
  ("2", "2.0000001", False),
  ("6", "5.9999999", False),
  ("3.14", "\\pi", False),
  # Integers, separators, signs, powers.
  ("1000", "1,000", True),
  ("1000", "1{,}000", True),
  ("1000000", "10^6", True),
  ("72", "72", True),
  ("72", "27", False),
  ("-5", "5", False),
  ("0", "-0", True),
  ("2^{10}", "1024", True),
  ("2^{10}", "1023", False),
  ("100", "1000", False),
  # Percentages: Math-Verify accepts a percentage for its value and for its
  # bare number (documented "percentage" handling), hence 25% ~ 25.
  ("50\\%", "0.5", True),
  ("0.5", "50\\%", True),
  ("25\\%", "25", True),
  ("18", "18\\%", True),
  ("20\\%", "0.02", False),
  # Radicals and symbolic expressions.
  ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", True),
  ("2\\sqrt{3}", "\\sqrt{12}", True),
  ("\\sqrt{8}", "2\\sqrt{2}", True),
  ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}2", True),
  ("\\sqrt{3}", "\\sqrt{2}", False),
  ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", False),
  ("x+1", "1+x", True),
  ("(x+1)^2", "x^2+2x+1", True),
  ("x^2-1", "(x-1)(x+1)", True),
  ("a^2+b^2", "b^2+a^2", True),
  ("x^2+1", "x^2-1", False),
  ("2x", "2y", False),
  ("\\pi/2", "\\frac{\\pi}{2}", True),
  ("2\\pi", "6.28", False),
  ("\\log_2 8", "3", True),
  ("\\sin^2 x + \\cos^2 x", "1", True),
  ("1/2", "1/3", False),
  # Equations: an assignment `x=2` is unwrapped to its value.
  ("x=2", "2", True),
  ("2", "x=2", True),
  ("y=2x+3", "y=3+2x", True),
  ("x=3", "x=4", False),
  # Sets, tuples, intervals.
  ("\\{1,2\\}", "\\{2,1\\}", True),
  ("\\{1,2,3\\}", "1,2,3", True),
  ("\\pm 2", "2,-2", True),
  ("\\{1,2\\}", "\\{1,3\\}", False),
  ("\\emptyset", "\\{\\}", True),
  ("(3,-1)", "(3, -1)", True),
  ("(1,2)", "(2,1)", False),
  ("[1,2)", "[1,2)", True),
  ("[1,2)", "[1,2]", False),
  ("(-\\infty, 3]", "(-\\infty,3]", True),
  ("x \\geq 3", "[3,\\infty)", True),
  ("(0,1)\\cup(2,3)", "(2,3)\\cup(0,1)", True),
  ("[0,1]", "[0,2]", False),
  ("\\infty", "-\\infty", False),
  # Units, text, degrees, currency.
  ("10\\text{ cm}", "10", True),
  ("10", "10\\text{ meters}", True),
  ("5", "\\$5", True),
  ("30", "30^\\circ", True),
  ("7", "8\\text{ cm}", False),
  ("\\text{Evelyn}", "Evelyn", True),
  ("\\text{Evelyn}", "Bob", False),
  # Multiple choice (single letters match case-insensitively).
  ("\\text{(A)}", "A", True),
  ("B", "b", True),
  ("C", "D", False),
  # Matrices, complex numbers.
  (
    "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
    "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
    True,
  ),
  (
    "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
    "\\begin{pmatrix}2\\\\1\\end{pmatrix}",
    False,
  ),
  ("3+4i", "4i+3", True),
  ("3+4i", "3-4i", False),
]


# ---------------------------------------------------------------- math


def test_math_verify_agrees_with_the_table(pool):
  assert len(MATH_PAIRS) >= 60
  golds = [g for g, _, _ in MATH_PAIRS]
  completions = [f"So the answer is \\boxed{{{p}}}." for _, p, _ in MATH_PAIRS]
  scores, status = math_lib.verify_batch(completions, golds, pool=pool)
  assert (status == pool_lib.OK).all(), status
  wrong = [
    (g, p, label)
    for (g, p, label), s in zip(MATH_PAIRS, scores, strict=True)
    if bool(s) != label
  ]
  assert not wrong
  assert scores.dtype == np.float32 and scores.shape == (len(MATH_PAIRS),)


def test_math_extraction_forms(pool):
  completions = [
    "<think>2+2</think> <answer>4</answer>",
    "<think>..</think><answer>so \\boxed{4}</answer>",
    "first \\boxed{3} then \\boxed{\\frac{8}{2}}",
    "work...\nAnswer: 4",
    "the answer is 4",  # No marker: not extracted.
    "\\boxed{4",  # Unbalanced box.
    "<answer>5</answer>",
  ]
  scores = rewards.get("math")(completions, ["4"] * 7, pool=pool)
  np.testing.assert_array_equal(scores, [1, 1, 1, 1, 0, 0, 0])


def test_hostile_batch_is_bounded_and_scores_normal_items(pool, tmp_path):
  marker = tmp_path / "pwned"
  hostile = [
    "\\boxed{9^{9^{9^{9}}}}",  # Power tower: hangs sympy.
    "\\boxed{" + "x" * 2**20 + "}",  # 1 MB answer.
    "\\boxed{" + "{" * 60 + "1" + "}" * 60 + "}",  # Deep nesting.
    "\\boxed{\u2603\u00e9\U0001f600\x00\x07\ufffd}",  # Unicode junk.
    "<answer>" * 100000,  # Many unclosed tags.
    f"\\boxed{{__import__('os').system('touch {marker}')}}",
  ]
  normal = ["\\boxed{\\frac{1}{2}}", "<answer>0.5</answer>", "\\boxed{3}"]
  completions = hostile[:3] + normal[:1] + hostile[3:] + normal[1:]
  golds = ["1"] * 3 + ["1/2"] + ["1"] * 3 + ["1/2", "4"]
  before = dict(pool.counts)
  start = time.monotonic()
  scores, status = math_lib.verify_batch(
    completions, golds, pool=pool, timeout=1.5
  )
  elapsed = time.monotonic() - start
  # Margin for a loaded 2-core CI machine (another pytest worker runs
  # beside this one); without the timeout the power tower runs for minutes.
  assert elapsed < 1.5 + 8.0, elapsed
  np.testing.assert_array_equal(scores, [0, 0, 0, 1, 0, 0, 0, 1, 0])
  assert status[0] in (pool_lib.TIMEOUT, pool_lib.ERROR), status
  assert status[1] == status[2] == pool_lib.REJECTED
  failures = sum(
    pool.counts[k] - before.get(k, 0) for k in ("timeout", "error")
  )
  assert failures >= 1
  assert pool.counts["rejected"] - before.get("rejected", 0) == 2
  assert not marker.exists()
  # The pool is healthy afterwards.
  again, _ = math_lib.verify_batch(normal, ["1/2", "1/2", "3"], pool=pool)
  np.testing.assert_array_equal(again, [1, 1, 1])


_STUCK = """
import signal
import time


def stuck(seconds):
  # Blocks SIGALRM like C code that never returns to the interpreter, so only
  # the pool's kill can stop it.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
  time.sleep(seconds)
  return 1.0
"""


def test_pool_kills_stuck_workers_and_survives_crashes(tmp_path, monkeypatch):
  (tmp_path / "stuck_helper.py").write_text(_STUCK)
  monkeypatch.syspath_prepend(str(tmp_path))
  import stuck_helper

  with pool_lib.VerifierPool(num_workers=1, timeout=1.0) as p:
    first_pid = p.pids()[0]
    start = time.monotonic()
    values, status = p.map(stuck_helper.stuck, [(60,)])
    # Margin for a loaded 2-core CI machine; the stuck call sleeps 60 s.
    assert time.monotonic() - start < 1.0 + 8.0
    assert list(status) == [pool_lib.TIMEOUT] and values[0] == 0.0
    assert p.pids()[0] != first_pid and _reaped(first_pid)
    values, status = p.map(pow, [(2, 10)])  # Served by the new worker.
    assert values[0] == 1024.0 and list(status) == [pool_lib.OK]
    # A worker that dies mid-item (os._exit) is a counted crash.
    values, status = p.map(os._exit, [(3,)])
    assert list(status) == [pool_lib.CRASH] and p.counts["crash"] == 1
    assert p.counts["timeout"] == 1
    values, status = p.map(pow, [(3, 2)])
    assert values[0] == 9.0
    pids = p.pids()
  assert all(_reaped(pid) for pid in pids)


def test_pool_reports_workers_that_cannot_start():
  with pool_lib.VerifierPool(num_workers=1, warmup=sys.exit) as p:
    with pytest.raises(RuntimeError, match="start-up"):
      p.map(pow, [(2, 3)])
    pids = p.pids()
  assert all(_reaped(pid) for pid in pids)


# ---------------------------------------------------------------- registry


def test_registry_names_and_errors():
  names = rewards.names()
  for name in (
    "math",
    "exact_match",
    "format",
    "overlong",
    "laser",
    "truncation",
    "token_budget",
    "majority_vote",
    "neg_entropy",
    "self_certainty",
    "format_length",
    "task:knights",
  ):
    assert name in names
  with pytest.raises(KeyError):
    rewards.get("nope")
  with pytest.raises(TypeError, match="no argument"):
    rewards.get("overlong", max_len=3)


def test_task_and_exact_match_rewards():
  task = tasks.get("arithmetic")
  problems = task.problems("train", 4, 1)
  completions = [p.solution for p in problems[:2]] + ["answer: x", ""]
  scores = rewards.get("task:arithmetic")(
    completions, [p.answer for p in problems]
  )
  np.testing.assert_array_equal(scores, [1, 1, 0, 0])
  scores = rewards.get("exact_match")(
    ["<answer> $42$ </answer>", "\\boxed{\\text{yes}}", "\\boxed{41}", "42"],
    ["42", "yes", "42", "42"],
  )
  np.testing.assert_array_equal(scores, [1, 1, 0, 0])


def test_combine_weights_components_and_routes_kwargs(pool):
  fn = rewards.combine(
    {"math": 1.0, "format": 0.1, "overlong": 0.5},
    params={"overlong": {"max_length": 100, "buffer_length": 20}},
  )
  completions = [
    "<think>\nhm\n</think>\n<answer>\n\\boxed{2}\n</answer>",
    "\\boxed{2}",
    "<think>x</think><answer>3</answer>",
  ]
  total, parts = fn(
    completions, ["2", "2", "2"], lengths=[10, 90, 100], pool=pool
  )
  np.testing.assert_allclose(parts["math"], [1, 1, 0], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(parts["format"], [1, 0, 1], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    parts["overlong"], [0, -0.5, -1], rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(total, [1.1, 0.75, -0.4], rtol=1e-6, atol=1e-6)
  assert total.dtype == np.float32
  with pytest.raises(TypeError, match="no reward component takes"):
    fn(completions, ["2"] * 3, lengths=[1, 2, 3], pool=pool, lenghts=1)


def test_combine_passes_correctness_to_length_rewards():
  fn = rewards.combine(
    {"task:arithmetic": 0.0, "truncation": 1.0, "laser": 1.0},
    params={"truncation": {"max_length": 50}, "laser": {"target_length": 30}},
    correct_from="task:arithmetic",
  )
  completions = ["answer: 5", "answer: 5", "answer: 4", "answer: 5"]
  total, parts = fn(completions, ["5"] * 4, lengths=[20, 40, 20, 60])
  np.testing.assert_array_equal(parts["task:arithmetic"], [1, 1, 0, 1])
  np.testing.assert_array_equal(parts["truncation"], [1, 1, 0, 0])
  np.testing.assert_array_equal(parts["laser"], [0.5, 0, 0, 0])
  np.testing.assert_array_equal(total, [1.5, 1, 0, 0])
  # Unregistered components come in through `fns`.
  fn = rewards.combine(
    {"const": 2.0, "answer_line": 1.0},
    fns={"const": lambda c, a: np.ones(len(c))},
  )
  total, parts = fn(["answer: 1", "no"], None)
  np.testing.assert_array_equal(total, [3, 2])
  assert sorted(parts) == ["answer_line", "const"]


# ---------------------------------------------------------------- format


def test_format_rewards():
  good = "<think>\nreason\n</think>\n<answer>\n42\n</answer>"
  cases = [
    good,
    "  " + good + "\n",
    "<think>a</think>junk<answer>42</answer>",
    "<think>a</think><answer>1</answer><answer>2</answer>",
    "<answer>42</answer><think>a</think>",
    "text <think>a</think> <answer>42</answer>",
    "<think>a</think><answer> </answer>",
    "<think>" * 50000,
  ]
  np.testing.assert_array_equal(
    rewards.get("format_strict")(cases), [1, 1, 0, 0, 0, 0, 0, 0]
  )
  np.testing.assert_array_equal(
    rewards.get("format_soft")(cases), [1, 1, 1, 1, 0, 1, 1, 0]
  )
  prefilled = rewards.get("format", prefilled="<think>\n")
  np.testing.assert_array_equal(
    prefilled(["hm\n</think>\n<answer>\n1\n</answer>", good]), [1, 0]
  )
  np.testing.assert_array_equal(
    rewards.get("answer_line")(["1+1=2\nanswer: 2", "answer:2"]), [1, 0]
  )


# ---------------------------------------------------------------- length


def test_overlong_matches_dapo_formula():
  # Lmax=100, Lbuf=20: 0 up to 80, linear to -1 at 100, -1 beyond.
  r = length.overlong(
    ["."] * 6,
    lengths=[0, 80, 85, 90, 100, 130],
    max_length=100,
    buffer_length=20,
  )
  np.testing.assert_allclose(
    r, [0, 0, -0.25, -0.5, -1, -1], rtol=1e-6, atol=1e-6
  )
  r = length.overlong(
    ["."] * 2,
    lengths=[90, 100],
    max_length=100,
    buffer_length=20,
    penalty_factor=2.0,
  )
  np.testing.assert_allclose(r, [-1, -2], rtol=1e-6, atol=1e-6)


def test_truncation_laser_and_budgets():
  c = ["."] * 4
  correct = [1, 1, 0, 1]
  lens = [10, 30, 10, 50]
  np.testing.assert_array_equal(
    length.truncation(
      c, lengths=lens, max_length=[20, 40, 20, 40], correct=correct
    ),
    [1, 1, 0, 0],
  )
  for mode, want in [
    ("reward", [0.5, 0, 0, 0]),
    ("penalty", [0, -0.5, 0, -0.5]),
    ("hybrid", [0.5, -0.5, 0, -0.5]),
  ]:
    np.testing.assert_array_equal(
      length.laser(
        c, lengths=lens, target_length=20, correct=correct, mode=mode
      ),
      want,
    )
  # LASER-D: group accuracies 1.0 (easy), 0.5 (medium), 0.0 (hard).
  targets = length.laser_d_targets(
    [1, 1, 1, 0, 0, 0], 2, easy=10, medium=20, hard=30
  )
  np.testing.assert_array_equal(targets, [10, 10, 20, 20, 30, 30])
  np.testing.assert_allclose(
    length.token_budget(c, lengths=lens, budget=20, alpha=0.1),
    [0, -1, 0, -3],
    rtol=1e-6,
    atol=1e-6,
  )
  np.testing.assert_allclose(
    length.token_budget(c, lengths=lens, budget=20, alpha=0.1, mode="abs"),
    [-1, -1, -1, -3],
    rtol=1e-6,
    atol=1e-6,
  )


# ---------------------------------------------------------------- label-free


def test_majority_vote():
  group = ["\\boxed{2}", "<answer>2</answer>", "\\boxed{3}", "no answer"]
  tie = ["\\boxed{5}", "\\boxed{6}", "\\boxed{6}", "\\boxed{5}"]
  none = ["a", "b", "c", "d"]
  r = rewards.get("majority_vote")(group + tie + none, None, group_size=4)
  np.testing.assert_array_equal(r, [1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0])
  r = rewards.get(
    "majority_vote", group_size=2, extract_fn=tasks.extract_answer
  )(["answer: 1", "answer: 1", "answer: 2", "x"], None)
  np.testing.assert_array_equal(r, [1, 1, 1, 0])


def test_confidence_rewards():
  entropy = np.array([[1.0, 3.0, 9.0], [0.5, 0.5, 0.5], [2.0, 2.0, 2.0]])
  mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
  r = rewards.get("neg_entropy")(
    ["a"] * 3, None, token_entropy=entropy, mask=mask
  )
  np.testing.assert_allclose(r, [-2.0, -0.5, 0.0], rtol=1e-6, atol=1e-6)
  r = rewards.get("self_certainty")(
    ["a"] * 3, None, token_self_certainty=entropy, mask=mask
  )
  np.testing.assert_allclose(r, [2.0, 0.5, 0.0], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="N=2"):
    rewards.get("neg_entropy")(
      ["a"] * 2, None, token_entropy=entropy, mask=mask
    )


def test_format_length_surrogate():
  c = [
    "<think>x</think> \\boxed{1}",  # Think + answer.
    "\\boxed{1}",  # Answer only.
    "<think>x</think> no answer",
    "nothing",
  ]
  r = rewards.get("format_length")(
    c, None, lengths=[50, 50, 50, 100], max_length=100
  )
  # f(0.5) = 1 at the peak; f(1.0) = -1.
  np.testing.assert_allclose(r, [2.0, 1.5, 0.0, -1.0], rtol=1e-6, atol=1e-6)
  r = rewards.get("format_length")(
    c, None, lengths=[25, 25, 25, 25], max_length=100, length_weight=0.0
  )
  np.testing.assert_allclose(r, [1.0, 0.5, 0.0, 0.0], rtol=1e-6, atol=1e-6)
