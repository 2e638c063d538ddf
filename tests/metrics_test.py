"""metrics.jsonl on resume: later steps cut back, a torn last line dropped."""

import io
import json
import types

import numpy as np
import pytest

from rlreason import metrics


def _write(path, steps, torn=False):
  with open(path, "w") as f:
    for s in steps:
      f.write(json.dumps({"step": s, "reward": s / 10}) + "\n")
    if torn:
      f.write('{"step": 99, "rew')


def _steps(path):
  return [r["step"] for r in metrics.read_jsonl(path)]


def test_resume_cuts_the_steps_after_the_checkpoint(tmp_path):
  _write(tmp_path / "metrics.jsonl", [0, 1, 2, 3, 4, 5])
  w = metrics.MetricWriter(str(tmp_path), tensorboard=False, keep_through=3)
  w.write(4, {"reward": 0.4})
  w.close()
  assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4]


def test_a_torn_last_line_is_dropped_and_the_next_row_is_whole(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write(path, [0, 1, 2], torn=True)
  assert _steps(path) == [0, 1, 2]  # read_jsonl skips it too
  w = metrics.MetricWriter(str(tmp_path), tensorboard=False, keep_through=2)
  w.write(3, {"reward": 0.3})
  w.close()
  assert _steps(path) == [0, 1, 2, 3]
  assert path.read_text().count("\n") == 4


def test_without_keep_through_rows_are_kept(tmp_path):
  _write(tmp_path / "metrics.jsonl", [0, 1, 2])
  w = metrics.MetricWriter(str(tmp_path), tensorboard=False)
  w.write(1, {"reward": 0.1})
  w.close()
  assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 1]


def test_a_torn_line_before_the_last_is_an_error_naming_the_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0}\n{"step": 1, "x\n{"step": 2}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
    metrics.read_jsonl(path)


def test_progress_lines_and_their_throttle(monkeypatch):
  """update prints a line each call; maybe only once `every` seconds have
  passed since the last line (or the start), then counts from it."""
  now = [100.0]
  monkeypatch.setattr(metrics.time, "time", lambda: now[0])
  out = io.StringIO()
  p = metrics.Progress(10, 2, stream=out, label="eval problems", every=30)
  now[0] = 110.0
  assert p.maybe(4) is None  # 10 s in: not due
  now[0] = 130.0
  line = p.maybe(6, {"accuracy": 0.5, "other": 1.0})
  # 4 of 8 problems in 30 s: 30 s to go.
  assert line == "eval problems 6/10 | accuracy 0.500 | 0:30 elapsed, ETA 0:30"
  now[0] = 150.0
  assert p.maybe(8) is None  # 20 s after the last line
  assert p.update(8).startswith("eval problems 8/10 | 0:50 elapsed")
  now[0] = 179.0
  assert p.maybe(9) is None  # update counts as a line: 29 s since
  assert out.getvalue().splitlines()[0] == line
  assert len(out.getvalue().splitlines()) == 2


def test_a_steps_row_by_hand():
  """Updates' metrics averaged, skips summed, make_batch's as they are
  (over the updates' where both name one), lengths and phase times."""
  rollout = types.SimpleNamespace(
    lengths=np.array([2, 4, 6, 8]),
    finish_reasons=np.array(["eos", "length", "eos", "length"]),
  )
  updates = [
    {"loss": 1.0, "skipped": 0.0, "empty": 1.0, "reward": 9.0},
    {"loss": 3.0, "skipped": 1.0, "empty": 1.0, "reward": 9.0},
  ]
  row = metrics.step_row(updates, {"reward": 0.5}, rollout, (10, 12, 13, 17))
  assert row == {
    "loss": 2.0,
    "skipped": 1.0,
    "empty": 2.0,
    "reward": 0.5,
    "length": 5.0,
    "length_max": 8,
    "truncated": 0.5,
    "time/rollout": 2,
    "time/reward": 1,
    "time/update": 4,
    "time/step": 7,
    "tokens_per_sec": 10.0,  # 20 tokens in 2 s
  }
  # On an accelerator: the updates' model FLOPs over 4 s at 1 TFLOP/s.
  row = metrics.step_row(
    updates, {}, rollout, (10, 12, 13, 17), update_flops=(2e12, 1e12)
  )
  assert row["mfu/update"] == pytest.approx(0.5, rel=1e-9, abs=1e-12)


def test_a_long_compilation_says_so_while_it_runs_and_when_done():
  """JAX's compile events, sent by hand: a compilation running 0.35 s with
  a line due every 0.1 s prints 'so far' lines, then its time; a short
  one prints nothing; nothing once the block is left."""
  import time

  from jax import monitoring

  event, out = "/jax/core/compile/backend_compile_duration", io.StringIO()
  with metrics.compile_lines(every=0.1, stream=out):
    monitoring.record_scalar(event, time.time(), fun_name="jit(step)")
    time.sleep(0.35)
    monitoring.record_event_duration_secs(event, 0.35, fun_name="jit(step)")
    monitoring.record_scalar(event, time.time(), fun_name="jit(tiny)")
    monitoring.record_event_duration_secs(event, 0.01, fun_name="jit(tiny)")
  lines = out.getvalue().splitlines()
  assert lines[-1] == "compiled jit(step) in 0:00", lines
  assert 1 <= len(lines[:-1]) <= 4, lines  # at 0.1, 0.2, 0.3 s
  assert set(lines[:-1]) == {"compiling jit(step): 0:00 so far"}
  monitoring.record_event_duration_secs(event, 9.0, fun_name="jit(step)")
  assert out.getvalue().splitlines() == lines  # the listeners are gone
  quiet = io.StringIO()
  with metrics.compile_lines(enabled=False, every=0.0, stream=quiet):
    monitoring.record_event_duration_secs(event, 9.0, fun_name="jit(step)")
  assert quiet.getvalue() == ""


def test_compile_lines_hear_a_real_compilation():
  """jax.jit's own events reach it (a constant of this run's: no
  persistent-cache hit)."""
  import time

  import jax
  import jax.numpy as jnp

  out, stamp = io.StringIO(), float(time.time_ns() % 1_000_003)

  def fresh_program(x):
    return jnp.sin(x) * stamp

  with metrics.compile_lines(every=0.0, stream=out):
    jax.jit(fresh_program)(jnp.ones(3)).block_until_ready()
  assert "compiled jit(fresh_program) in 0:00" in out.getvalue().splitlines()
