"""Hand-computed tests of rlreason/guidance/hints.py."""

import numpy as np
import pytest

from rlreason.data import iterator
from rlreason.data import sources as data_lib
from rlreason.guidance import hints
from rlreason.model import tokenizer as tokenizer_lib

EX = data_lib.Example(
  "arithmetic-d1-x", "3+4*2=", "11", "3+8\n=11\nanswer: 11", 1, ("4*2=8",)
)


def test_knowledge_hint():
  assert hints.knowledge_hint(("a", "b", "c"), 2) == "hint: a; b"
  assert hints.knowledge_hint(("a", "b")) == "hint: a; b"
  assert hints.knowledge_hint((), 3) == ""
  assert hints.knowledge_hint(("a",), 0) == ""


@pytest.mark.parametrize(
  "fraction, expected",
  [(0.0, ""), (0.5, "3+8\n"), (0.25, "3+8\n"), (1.0, "3+8\n=11\n")],
)
def test_solution_prefix_whole_lines_never_the_answer(fraction, expected):
  assert hints.solution_prefix(EX.solution, fraction) == expected


@pytest.mark.parametrize(
  "fraction, shown", [(0.0, 0.0), (0.05, 0.5), (0.5, 0.5), (0.7, 1.0)]
)
def test_shown_fraction_counts_whole_lines(fraction, shown):
  # 2 lines before the answer: any fraction up to 0.5 shows one of them.
  assert hints.shown_fraction(EX.solution, fraction) == shown
  assert hints.shown_fraction("answer: 1", 0.5) == 0.0


def test_expert_hint_whole_solution_with_answer():
  assert hints.expert_hint(EX.solution) == "expert: 3+8; =11; answer: 11"
  assert hints.expert_hint("a\n\n b ", "redo") == "expert: a; b\nredo"
  assert hints.expert_hint("") == hints.expert_hint("\n", "redo") == ""
  tok = tokenizer_lib.load("char")
  ex = hints.with_hint(EX, hint=hints.expert_hint(EX.solution))
  assert hints.prompt_text(tok, ex, "plain") == (
    "expert: 3+8; =11; answer: 11\n3+4*2="
  )


def test_prompt_text_hint_before_question_prefix_after():
  tok = tokenizer_lib.load("char")
  ex = hints.with_hint(EX, hint="hint: 4*2=8", prefix="3+8\n")
  assert hints.prompt_text(tok, ex, "plain") == "hint: 4*2=8\n3+4*2=3+8\n"
  assert hints.prompt_text(tok, ex, "plain", hinted=False) == "3+4*2="
  assert hints.is_hinted(ex) and not hints.is_hinted(hints.unhinted(ex))
  assert hints.unhinted(ex) == EX


def test_hint_after_follows_the_question_inside_the_template():
  tok = tokenizer_lib.load("char")
  ex = hints.with_hint(EX, hint_after="\nref: 3+8")
  assert hints.prompt_text(tok, ex, "plain") == "3+4*2=\nref: 3+8"
  assert hints.prompt_text(tok, ex, "plain", hinted=False) == "3+4*2="
  assert hints.is_hinted(ex) and hints.unhinted(ex) == EX
  # A template wraps question and hint_after together (a chat template:
  # the user's turn, as the authors' GHPO).
  assert hints.prompt_text(tok, ex, "r1") == tokenizer_lib.apply_template(
    tok, "3+4*2=\nref: 3+8", "r1"
  )


def test_ghpo_places_the_solution_part_where_its_flag_says():
  from experiments import ghpo

  ex = hints.with_hint(EX)  # solution "3+8\n=11\nanswer: 11"
  tok = tokenizer_lib.load("char")
  after = ghpo.stage_fn(0.5, "question")(ex, None)
  assert (
    after.prefix == "" and after.hint_after == ghpo.REFERENCE_INTRO + "3+8\n"
  )
  assert hints.prompt_text(tok, after, "plain") == (
    "3+4*2=\n The following text is the beginning part of the answer, which"
    " you can refer to for solving the problem:\n3+8\n"
  )
  start = ghpo.stage_fn(0.5)(ex, None)
  assert start.hint_after == "" and start.prefix == "3+8\n"
  assert hints.prompt_text(tok, start, "plain") == "3+4*2=3+8\n"
  assert ghpo.PAPER["hint_placement"] == "question"
  with pytest.raises(ValueError, match="--hint_placement='x'"):
    ghpo.Config(hint_placement="x").validate()


def test_rebase_moves_completion_to_new_prompt():
  pad = 0
  # Two rows, P = 3, T = 2; row 1's second completion token is padding.
  tokens = np.array([[0, 7, 8, 5, 6], [9, 9, 9, 5, 0]])
  positions = np.array([[-1, 0, 1, 2, 3], [0, 1, 2, 3, -1]])
  new_tok, new_pos = hints.rebase(tokens, positions, 3, [[4], [1, 2]], pad)
  np.testing.assert_array_equal(new_tok, [[0, 4, 5, 6], [1, 2, 5, 0]])
  np.testing.assert_array_equal(new_pos, [[-1, 0, 1, 2], [0, 1, 2, -1]])


def test_irt_fit_recovers_location():
  # One point at the curve's midpoint: the location is that ratio.
  b = hints.fit_irt_location([0.5], [0.5], [8], slope=6.0)
  assert b == pytest.approx(0.5, rel=1e-6, abs=1e-6)
  # Data generated from the model are fitted back.
  r = np.array([0.0, 0.25, 0.5, 0.75])
  y = hints.irt_accuracy(r, 0.3, slope=6.0)
  assert hints.fit_irt_location(r, y, [8] * 4, slope=6.0) == pytest.approx(
    0.3, rel=1e-6, abs=1e-6
  )
  # All wrong at the largest ratio: the location is beyond it (clipped).
  assert hints.fit_irt_location([1.0], [0.0], [4], slope=6.0) == 3.0
  assert hints.fit_irt_location([], [], [], slope=6.0) == 0.5


def test_ratio_for_accuracy():
  assert hints.ratio_for_accuracy(0.3, 0.5, slope=6.0) == pytest.approx(
    0.3, rel=1e-6, abs=1e-6
  )
  # sigmoid(6 (r - 0.3)) = 0.75 -> r = 0.3 + ln(3) / 6.
  assert hints.ratio_for_accuracy(0.3, 0.75, slope=6.0) == pytest.approx(
    0.3 + np.log(3) / 6, rel=1e-6, abs=1e-6
  )
  assert hints.ratio_for_accuracy(-1.0, 0.5, slope=6.0) == 0.0
  assert hints.ratio_for_accuracy(2.0, 0.5, slope=6.0) == 1.0


def test_task_examples_carry_knowledge():
  ex = data_lib.load("task:arithmetic:difficulty=2,n=3")
  assert all(e.knowledge for e in ex)
  assert all(e.hint == "" and e.prefix == "" for e in ex)


def test_hinted_iterator_maps_examples_and_keeps_state():
  class Cfg:
    batch_size, seed = 2, 0

  def factory(cfg, examples):
    return iterator.PromptIterator(examples, cfg.batch_size, seed=cfg.seed)

  ex = data_lib.load("task:arithmetic:difficulty=1,n=4")
  it = hints.hinted_iterator(
    factory, lambda e: hints.with_hint(e, hint="hint: x")
  )(Cfg, ex)
  batch = next(it)
  assert all(e.hint == "hint: x" for e in batch)
  state = it.state()
  nxt = next(it)
  it2 = hints.hinted_iterator(factory, hints.unhinted)(Cfg, ex)
  it2.restore(state)
  assert [e.uid for e in next(it2)] == [e.uid for e in nxt]
