"""The synthetic pretraining corpus and its solvers: slips, schools, hints."""

import dataclasses
import random
import re

import numpy as np
import pytest

from rlreason.train import corpus
from rlreason.train import search_traces
from rlreason.train import traces
from rlreason.data import tasks

EXACT = corpus.Mix(
  step_error=0.0, check=0.0, textbook=0.0, hinted=0.0, guided=1.0
)


def _problems(name, d, n=40):
  return corpus._pool(name, d, n, seed=0)[:n]


def test_documents_are_a_pure_function_of_the_seed():
  a = corpus.documents(corpus.Mix(), 300, seed=3)
  b = corpus.documents(corpus.Mix(), 300, seed=3)
  c = corpus.documents(corpus.Mix(), 300, seed=4)
  assert a == b and a != c
  for d in a:
    if d.kind == "drill":
      continue  # facts only (test_drills_hold_right_facts)
    assert tasks.extract_answer(d.completion) is not None, d
    assert tasks.base.is_ascii_text(d.prompt + d.completion)


def test_documents_use_only_train_problems():
  for d in corpus.documents(corpus.Mix(), 300, seed=0):
    if d.kind == "drill":
      continue
    question = d.prompt.split("\n", 1)[1] if d.hinted else d.prompt
    assert tasks.get(d.task).split_of(question) == "train"


def test_mix_shares_of_documents():
  docs = corpus.documents(corpus.Mix(), 2000, seed=0)
  share = {
    n: np.mean([d.task == n for d in docs]) for n, _, _ in corpus.Mix().tasks
  }
  want = {n: s for n, s, _ in corpus.Mix().tasks}
  for n in want:
    assert abs(share[n] - want[n]) < 0.04, (n, share[n])
  hinted = np.mean([d.hinted for d in docs])
  assert 0.08 < hinted < 0.16  # Mix.hinted, of the problems with knowledge


@pytest.mark.parametrize(
  "name,levels", [(n, l) for n, _, l in corpus.Mix().tasks]
)
def test_slip_free_solvers_are_right(name, levels):
  task = tasks.get(name)
  rng = random.Random(0)
  mix = dataclasses.replace(EXACT, shortcut=(0.0, 0.0))
  for d in range(1, levels + 1):
    for p in _problems(name, d, 15):
      trace = corpus.SOLVERS[name](p, rng, mix)
      if name == "countdown" and trace.count("\n") >= mix.search_lines:
        continue  # a search cut at the line budget ends in a guess
      assert task.verify(trace, p.answer) == 1.0, (p.prompt, trace)


def test_arithmetic_schools_and_a_hand_checked_trace():
  p = tasks.Problem("3+4*2=", "11", "", 1, (), "x")
  right = traces.arithmetic_trace(
    p, random.Random(0), dataclasses.replace(EXACT, shortcut=(0.0, 0.0))
  )
  assert (
    right
    == "order: ( ), then *, then + -\n3+4*2\n4*2=8, so 3+8\n3+8=11\nanswer: 11"
  )
  short = traces.arithmetic_trace(
    p, random.Random(0), dataclasses.replace(EXACT, shortcut=(1.0, 1.0))
  )
  assert (
    short == "order: left to right\n3+4*2\n3+4=7, so 7*2\n7*2=14\nanswer: 14"
  )
  # Brackets are dropped by the shortcut: 2*(1+3) read as 2*1+3.
  q = tasks.Problem("2*(1+3)=", "8", "", 3, (), "y")
  got = traces.arithmetic_trace(
    q, random.Random(0), dataclasses.replace(EXACT, shortcut=(1.0, 1.0))
  )
  assert got == "order: left to right\n2*1+3\n2*1=2, so 2+3\n2+3=5\nanswer: 5"


def test_addsub_schools_by_hand():
  p = tasks.Problem("9-3+2-1=", "7", "", 2, (), "x")
  right = traces.addsub_trace(
    p, random.Random(0), dataclasses.replace(EXACT, shortcut=(0.0, 0.0))
  )
  assert right == (
    "order: left to right\n9-3+2-1\n9-3=6, so 6+2-1\n6+2=8, so 8-1\n"
    "8-1=7\nanswer: 7"
  )
  wrong = traces.addsub_trace(
    p, random.Random(0), dataclasses.replace(EXACT, shortcut=(1.0, 1.0))
  )
  assert wrong == (
    "order: +, then -\n9-3+2-1\n3+2=5, so 9-5-1\n9-5=4, so 4-1\n"
    "4-1=3\nanswer: 3"
  )
  # A hint puts the trace on the right school whatever the wrong share.
  hinted = traces.addsub_trace(
    p,
    random.Random(0),
    dataclasses.replace(EXACT, shortcut=(1.0, 1.0)),
    "hint: add and subtract from left to right",
  )
  assert hinted == right
  # Slip-free traces of either school reach that school's value.
  task = tasks.get("addsub5")
  for d in (1, 2, 3):
    for q in task.problems("train", 15, d):
      for share in (0.0, 1.0):
        mix = dataclasses.replace(EXACT, shortcut=(share, share))
        got = tasks.extract_answer(
          traces.addsub_trace(q, random.Random(d), mix)
        )
        want = (
          tasks.arithmetic.plus_first_value(q.prompt[:-1])
          if share
          else q.answer
        )
        assert got == str(want), (q.prompt, share)


def test_parse_expression_matches_the_task_renderer():
  for d in range(1, 9):
    for p in _problems("arithmetic", d, 10):
      tree = traces.parse_expression(p.prompt[:-1])
      assert tasks.arithmetic.render(tree) + "=" == p.prompt


def test_slips_grow_with_difficulty_and_checking_catches_them():
  mix = corpus.Mix(check=0.0, textbook=0.0, hinted=0.0, shortcut=(0.0, 0.0))
  task = tasks.get("arithmetic")
  acc = []
  for d in (1, 4):
    rng = random.Random(1)
    acc.append(
      np.mean(
        [
          task.verify(traces.arithmetic_trace(p, rng, mix), p.answer)
          for p in _problems("arithmetic", d, 200)
        ]
      )
    )
  assert acc[0] > acc[1] + 0.15, acc
  checked = dataclasses.replace(mix, check=1.0)
  rng = random.Random(1)
  written = [
    (p, traces.arithmetic_trace(p, rng, checked))
    for p in _problems("arithmetic", 4, 200)
  ]
  redone = [t for _, t in written if " not " in t]
  assert redone, "some slips are caught"
  with_check = np.mean([task.verify(t, p.answer) for p, t in written])
  assert with_check > acc[1] + 0.1, (with_check, acc[1])


_STEP = re.compile(r"^(-?\d+)([+-])(-?\d+)=(-?\d+)")


def _slipped(lines) -> bool:
  """Whether a pass's step lines (`4-3=1, so 1+2`) hold a wrong value."""
  for line in lines:
    m = _STEP.match(line)
    if m:
      a, op, b, v = m.groups()
      if (int(a) + int(b) if op == "+" else int(a) - int(b)) != int(v):
        return True
  return False


def test_redo_passes_follow_slips_and_end_when_two_agree():
  mix = corpus.Mix(
    check=0.0, textbook=0.0, hinted=0.0, shortcut=(0.0, 0.0), redo=1.0
  )
  task = tasks.get("addsub5")
  probs = _problems("addsub5", 3, 300)
  rng = random.Random(0)
  written = [traces.addsub_trace(p, rng, mix) for p in probs]
  redone, clean_redone, n_clean = [], 0, 0
  for p, t in zip(probs, written):
    body, answer = t.rsplit("\n", 1)
    chunks = body.split("\n" + traces.REDO)
    finals = [c.split("\n")[-1].split("=")[-1] for c in chunks]
    assert answer == traces.ANSWER + finals[-1], t  # the last pass's value
    for chunk in chunks[1:]:  # each redo restates the question
      assert chunk.split("\n")[0] == p.prompt.rstrip("="), t
    assert len(chunks) <= 3, t
    if len(chunks) == 2:  # the second pass agreed with the first
      assert finals[0] == finals[1], t
    if len(chunks) == 3:  # the first two disagreed
      assert finals[0] != finals[1], t
    if _slipped(chunks[0].split("\n")):  # a slipped first pass is redone
      assert len(chunks) > 1, t
    else:
      n_clean += 1
      clean_redone += len(chunks) > 1
    redone.append(len(chunks) > 1)
  redone = np.array(redone)
  assert {1, 2, 3} <= {t.count(traces.REDO) + 1 for t in written}
  # Clean first passes are redone a tenth as often (traces.REDO_QUIET).
  assert 0 < clean_redone / n_clean < 0.25, (clean_redone, n_clean)
  lengths = np.array([len(t) for t in written])
  assert lengths[redone].mean() > 1.8 * lengths[~redone].mean()
  # The last pass is right more often than a single pass.
  once = dataclasses.replace(mix, redo=0.0)
  rng = random.Random(0)
  single = [traces.addsub_trace(p, rng, once) for p in probs]
  acc = np.mean([task.verify(t, p.answer) for p, t in zip(probs, written)])
  acc1 = np.mean([task.verify(t, p.answer) for p, t in zip(probs, single)])
  assert acc > acc1 + 0.05, (acc, acc1)
  # Off in the default mix.
  assert not any(
    traces.REDO in d.completion for d in corpus.documents(corpus.Mix(), 300)
  )


def test_hinted_traces_copy_the_given_results():
  task = tasks.get("arithmetic")
  mix = corpus.Mix(step_error=0.5, error_growth=1.0, check=0.0)
  rng = random.Random(0)
  probs = _problems("arithmetic", 3, 50)
  plain = [
    task.verify(traces.arithmetic_trace(p, rng, mix), p.answer) for p in probs
  ]
  hinted = [
    task.verify(
      traces.arithmetic_trace(
        p, rng, mix, traces.hints_lib.knowledge_hint(p.knowledge)
      ),
      p.answer,
    )
    for p in probs
  ]
  assert np.mean(hinted) == 1.0 and np.mean(plain) < 0.5


def test_countdown_search_backtracks_and_is_cut():
  mix = corpus.Mix(guided=0.0, step_error=0.0)
  rng = random.Random(0)
  written = [
    search_traces.countdown_trace(p, rng, mix)
    for p in _problems("countdown", 3, 30)
  ]
  assert any("\nback\n" in t for t in written)
  for p, t in zip(_problems("countdown", 3, 30), written):
    # Cut after search_lines tried lines; each open branch then backs out.
    n_numbers = len(p.prompt.split()) - 4
    assert t.count("\n") <= mix.search_lines + n_numbers, t


def test_mix_validation():
  with pytest.raises(ValueError, match="levels"):
    corpus.Mix(tasks=(("arithmetic", 1.0, 99),)).validate()
  with pytest.raises(ValueError, match="hinted"):
    corpus.Mix(hinted=1.5).validate()
  with pytest.raises(ValueError, match="redo"):
    corpus.Mix(redo=-0.1).validate()


def test_drills_hold_right_facts():
  mix = dataclasses.replace(corpus.Mix(), drill=0.5)
  docs = corpus.documents(mix, 400, seed=0)
  drills = [d for d in docs if d.kind == "drill"]
  arithmetic = [d for d in docs if d.task == "arithmetic"]
  assert abs(len(drills) / len(arithmetic) - 0.5) < 0.1
  for d in drills:
    assert d.prompt == corpus.DRILL_PROMPT and not d.hinted
    lines = d.completion.split("\n")
    assert len(lines) == len(set(lines)) >= 4
    for line in lines:  # the shortcut school may go below zero: -4+2=-2
      expr, value = line.split("=")
      a, op, b = re.fullmatch(r"(-?\d+)([-+*])(\d+)", expr).groups()
      want = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}
      assert int(value) == want[op], line
  # Both schools' steps, by hand: 3+4*2 is 4*2=8, 3+8=11 (right order) and
  # 3+4=7, 7*2=14 (left to right).
  assert traces.arithmetic_facts("3+4*2=", False) == ["4*2=8", "3+8=11"]
  assert traces.arithmetic_facts("3+4*2=", True) == ["3+4=7", "7*2=14"]
  # Every task the arithmetic solver writes gets its drills, under its name.
  small = dataclasses.replace(mix, tasks=(("arithmetic5", 1.0, 2),))
  drills = [d for d in corpus.documents(small, 40, 0) if d.kind == "drill"]
  assert drills and {d.task for d in drills} == {"arithmetic5"}
  # No drills asked for: no rng draws for them, the corpus is unchanged.
  plain = dataclasses.replace(corpus.Mix(), drill=0.0)
  assert all(d.kind != "drill" for d in corpus.documents(plain, 200, 0))
