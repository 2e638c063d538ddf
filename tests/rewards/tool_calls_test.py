"""ToolRL's rewards (rlreason/rewards/tool_calls.py), hand-computed."""

import pytest

from rlreason.rewards import tool_calls

CALC = ("calculator", {"expression": "2+3"})


def test_match_counts_repeats():
  assert tool_calls.match(["a", "b"], ["a", "b"]) == 1.0
  assert tool_calls.match([], ["a"]) == tool_calls.match(["a"], []) == 0.0
  # a, a vs a: 1 in common of 2 + 1 - 1.
  assert tool_calls.match(["a", "a"], ["a"]) == pytest.approx(
    0.5, rel=1e-9, abs=1e-12
  )
  assert tool_calls.match(["a", "b"], ["b", "a"]) == 1.0  # order aside


@pytest.mark.parametrize(
  "pred, want",
  [
    ([CALC], 3.0),  # exact
    ([], -3.0),  # no call
    # A wrong expression: r_name 1, r_param 1, r_value 0: S = 2 of 3.
    ([("calculator", {"expression": "2+4"})], 6 * 2 / 3 - 3),
    # The gold call and a junk one: r_name = 1 / 2, the pair 2: 2.5 of 3.
    ([CALC, ("calculator", {"expression": "9"})], 6 * 2.5 / 3 - 3),
    # Right parameters under another name score nothing.
    ([("search", {"expression": "2+3"})], -3.0),
    # Another key: r_param 0, r_value 0; r_name 1: S = 1 of 3.
    ([("calculator", {"expr": "2+3"})], 6 * 1 / 3 - 3),
  ],
)
def test_correctness_hand_computed(pred, want):
  got = tool_calls.correctness(pred, [CALC])
  assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_greedy_pairing_in_gold_order_and_no_gold():
  gold = [
    ("f", {"x": 1, "y": 2}),
    ("f", {"x": 1}),
  ]
  pred = [("f", {"x": 1}), ("f", {"x": 1, "y": 2})]
  # Lists differ (order): r_name 1; gold 0 takes pred 1 (1 + 2), gold 1
  # pred 0 (1 + 1): S = 6 of S_max 1 + 3 + 2 = 6.
  assert tool_calls.correctness(pred, gold) == pytest.approx(
    3.0, rel=1e-9, abs=1e-12
  )
  assert tool_calls.correctness([CALC], []) == 0.0


def test_format_needs_a_call_when_the_gold_has_one():
  tools = ("calculator",)
  assert tool_calls.format_ok(["calculator: 2+3", "answer: 5"], tools) == 1
  assert tool_calls.format_ok(["answer: 5"], tools) == 0
  assert tool_calls.format_ok(["answer: 5"], tools, needs_call=False) == 1
  assert tool_calls.format_ok(["calculator: 2+3\nx", "answer: 5"], tools) == 0
  assert tool_calls.format_ok([], tools) == 0
