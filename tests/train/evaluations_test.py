"""evaluations.Evaluations: which weights the RL loop scores when, what it
writes (eval_before / eval_after.json with the scope, the metrics row), and
what a stop leaves. The scoring itself (context.run_eval) is replaced by a
fake here; loop_test runs it for real."""

import dataclasses
import json
import types

import pytest

from rlreason import config
from rlreason.train import context as context_lib
from rlreason.train import evaluations
from rlreason.train import preemption
from rlreason.train import run_info


class _Writer:
  def __init__(self):
    self.rows = []

  def write(self, step, row):
    self.rows.append((step, row))


def _evaluations(tmp_path, monkeypatch, *, steps=4, eval_every=0, stop=()):
  """An Evaluations whose policy() counts its calls and whose scoring gives
  accuracy step / 10, or stops (Interrupted) at the steps in `stop`."""
  cfg = dataclasses.replace(
    config.BaseConfig(), steps=steps, eval_every=eval_every, eval_samples=1
  )
  scored = []

  def fake_run_eval(ctx, params, examples, *, step, journal, **kwargs):
    assert params == "weights" and examples == ["q1", "q2"]
    assert journal == run_info.eval_journal(str(tmp_path), cfg, step)
    if step in stop:
      raise preemption.Interrupted()
    scored.append(step)
    return {"eval/accuracy": step / 10}

  monkeypatch.setattr(context_lib, "run_eval", fake_run_eval)
  calls = []
  scope = {"problems": 2, "trained_on": 0, "samples": 1}
  evals = evaluations.Evaluations(
    types.SimpleNamespace(cfg=cfg),
    ["q1", "q2"],
    scope,
    str(tmp_path),
    _Writer(),
    lambda: calls.append(1) or "weights",
  )
  return evals, scored, calls


def _json(path):
  return json.loads(path.read_text()) if path.exists() else None


def test_a_new_run_scores_its_initial_weights_into_eval_before(
  tmp_path, monkeypatch
):
  evals, scored, _ = _evaluations(tmp_path, monkeypatch)
  first, stopped = evals.at_start(0, resumed=False)
  assert (first, stopped, scored) == ({"eval/accuracy": 0.0}, False, [0])
  assert evals.writer.rows == [(0, {"eval/accuracy": 0.0})]
  before = _json(tmp_path / "eval_before.json")
  assert before == {"eval/accuracy": 0.0, **evals.scope}

  final, stopped = evals.at_end(0, first, finished=None)
  assert (final, stopped, scored) == ({"eval/accuracy": 0.4}, False, [0, 4])
  after = _json(tmp_path / "eval_after.json")
  assert after == {"eval/accuracy": 0.4, **evals.scope}


def test_a_stop_leaves_no_json_and_says_so(tmp_path, monkeypatch):
  evals, scored, _ = _evaluations(tmp_path, monkeypatch, stop=(0, 4))
  assert evals.at_start(0, resumed=False) == (None, True)
  assert evals.at_end(0, None, finished=None) == ({}, True)
  assert scored == [] and evals.writer.rows == []
  assert not (tmp_path / "eval_before.json").exists()
  assert not (tmp_path / "eval_after.json").exists()


@pytest.mark.parametrize(
  "start, metrics_rows, evaluates",
  [
    (2, [], True),  # --eval_every=2 scheduled one at step 2: not in the rows
    (2, [{"step": 2, "eval/accuracy": 0.2}], False),  # it is
    (3, [], False),  # none scheduled at step 3
  ],
)
def test_a_resumed_run_first_scores_an_evaluation_it_missed(
  tmp_path, monkeypatch, start, metrics_rows, evaluates
):
  evals, scored, calls = _evaluations(tmp_path, monkeypatch, eval_every=2)
  (tmp_path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in metrics_rows)
  )
  assert evals.at_start(start, resumed=True) == (None, False)
  assert scored == ([start] if evaluates else [])
  assert len(calls) == len(scored)  # LoRA merges only to score
  assert not (tmp_path / "eval_before.json").exists()


def test_weights_already_scored_are_not_scored_again(tmp_path, monkeypatch):
  evals, scored, calls = _evaluations(tmp_path, monkeypatch, steps=0)
  first, _ = evals.at_start(0, resumed=False)
  # --steps=0: the final weights are the initial ones.
  assert evals.at_end(0, first, finished=None) == (first, False)
  assert scored == [0] and len(calls) == 1

  # The rerun of a finished run: its eval_after.json's numbers.
  evals, scored, calls = _evaluations(tmp_path, monkeypatch, steps=4)
  finished = {"eval/accuracy": 0.9, **evals.scope}
  assert evals.at_end(4, None, finished) == (finished, False)
  assert scored == [] and calls == []
  assert _json(tmp_path / "eval_after.json") == finished
