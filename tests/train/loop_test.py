"""The loop's records under interruption and bad rewards.

SIGTERM is sent by the process to itself from inside a step (through the
reward function, which every step calls once), so where it lands is exact.
"""

import dataclasses
import json
import os
import re
import signal
import time
import warnings

import jax
import numpy as np
import pytest

from experiments import grpo
from rlreason import metrics
from rlreason import testing
from rlreason.model import transformer
from rlreason.train import checkpoint
from rlreason.train import preemption
from rlreason.train import context as context_lib
from rlreason.train import loaders
from rlreason.train import flags
from rlreason.train import loop as loop_lib
from rlreason.train import sft


def _cfg(tmp_path, run="run", **kw):
  return dataclasses.replace(
    grpo.TinyConfig(),
    **{**testing.SMOKE, **kw},
    workdir=str(tmp_path / run),
    cache_dir=str(tmp_path / "cache"),
  )


def _hooked_rewards(monkeypatch, hook):
  """Rewards as usual; hook(call_index, rewards) runs on every call."""
  combine = testing.hooked_combine(loaders.rewards_lib.combine, hook)
  monkeypatch.setattr(loaders.rewards_lib, "combine", combine)


def _hooked_sft_steps(monkeypatch, hook):
  """The warm start's steps as usual; hook(step) runs as each one starts
  (its batch is packed); returns the list of steps started."""
  pack, calls = sft.padding.pack, []

  def hooked(*args, **kwargs):
    calls.append(1)
    hook(len(calls))
    return pack(*args, **kwargs)

  monkeypatch.setattr(sft.padding, "pack", hooked)
  return calls


def _same_weights(a_dir, b_dir):
  from safetensors.numpy import load_file

  a = load_file(os.path.join(a_dir, "model.safetensors"))
  b = load_file(os.path.join(b_dir, "model.safetensors"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _train_steps(workdir):
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [r["step"] for r in rows if "loss" in r]


def _params(workdir, step):
  return testing.checkpoints(workdir)[step][1]


@pytest.mark.slow
def test_nonfinite_rewards_are_counted_and_skip_the_update(
  tmp_path, monkeypatch, caplog
):
  def hook(call, rewards):
    if call == 2:  # step 2: one NaN, one inf
      rewards[0], rewards[5] = np.nan, np.inf
    return rewards

  _hooked_rewards(monkeypatch, hook)
  cfg = _cfg(tmp_path, steps=2, keep_checkpoints=2)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", RuntimeWarning)
    grpo.run(cfg)
  # The log names them once (below); numpy's inf - inf warns nowhere.
  invalid = [w for w in caught if "invalid value" in str(w.message)]
  assert not invalid, [str(w.message) for w in invalid]
  rows = metrics.read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
  train = {r["step"]: r for r in rows if "loss" in r}
  assert train[2]["reward"] == "nan"
  assert train[1]["skipped"] == 0 and "reward_nonfinite" not in train[1]
  assert train[2]["reward_nonfinite"] == 2
  assert train[2]["skipped"] == cfg.ppo_epochs * cfg.minibatches
  assert train[2]["grad_norm"] == "nan"  # not 0.0: no gradient was used
  assert "2 of 16 rewards are not finite (rows [0, 5])" in caplog.text
  p1, p2 = _params(cfg.workdir, 1), _params(cfg.workdir, 2)
  jax.tree.map(np.testing.assert_array_equal, p1, p2)  # no update at step 2


def test_a_long_step_says_how_far_its_rollout_and_updates_are(
  tmp_path, monkeypatch, capsys
):
  """Lines due at once here: the rollout's after each sampler call but the
  last (16 sequences in static calls of 4), the updates' after each but
  the last (2 epochs of 2 minibatches)."""
  monkeypatch.setattr(context_lib, "PROGRESS_SECONDS", 0.0)
  cfg = _cfg(
    tmp_path,
    steps=1,
    warm_start_steps=0,
    rollout_rows=4,
    rollout_batching="static",
    minibatches=2,
    ppo_epochs=2,
  )
  grpo.run(cfg)
  lines = capsys.readouterr().err.splitlines()
  parts = [
    re.match(r"step 1/1: (.+) \| \d+:\d\d elapsed, ETA \d+:\d\d$", line)
    for line in lines
  ]
  assert [m[1] for m in parts if m] == [
    "rollout sequences 4/16",
    "rollout sequences 8/16",
    "rollout sequences 12/16",
    "updates 1/4",
    "updates 2/4",
    "updates 3/4",
  ], lines
  # The last step's checkpoint (written in the background), as slow as a
  # line is due.
  copied = r"checkpoint 1 copied to the host in \d+ s$"
  assert any(re.match(copied, x) for x in lines), lines


@pytest.mark.slow
def test_sigterm_stops_with_its_own_exit_code_and_resumes_cleanly(
  tmp_path, monkeypatch, capsys
):
  def hook(call, rewards):
    if call == 2:  # during step 2
      os.kill(os.getpid(), signal.SIGTERM)
    return rewards

  _hooked_rewards(monkeypatch, hook)
  cfg = _cfg(tmp_path, steps=4)
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "stopped", "step": 2, "steps": 4}
  report = open(os.path.join(cfg.workdir, "report.md")).read()
  assert "status: stopped at step 2 of 4" in report
  assert _train_steps(cfg.workdir) == [1, 2]
  err = capsys.readouterr().err  # the evaluation's line, where report is
  assert "eval at step 0/4 | accuracy " in err
  assert "| 4 held-out problems, greedy |" in err
  assert "eval at step 4/4" not in err
  assert f"report: {cfg.workdir}/report.md" in err
  # A torn row (the process died mid-write) and a redone step: both go.
  with open(os.path.join(cfg.workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 3, "loss": 0.1}\n{"step": 4, "lo')
  assert flags.run_checked(grpo.run, cfg) == 0
  assert _train_steps(cfg.workdir) == [1, 2, 3, 4]  # each step once
  err = capsys.readouterr().err
  assert f"resuming {cfg.workdir} at step 2/4 (its checkpoint)\n" in err
  assert "eval at step 0/4" not in err and "eval at step 4/4 | accuracy " in err
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "finished", "step": 4, "steps": 4}
  report = open(os.path.join(cfg.workdir, "report.md")).read()
  assert "status: finished (4 of 4 steps)" in report
  assert "RL steps logged: 4" in report
  # The same command once more: the finished run's last evaluation is
  # reused, not scored again.
  after = open(os.path.join(cfg.workdir, "eval_after.json")).read()
  rows = open(os.path.join(cfg.workdir, "metrics.jsonl")).read()
  _no_evaluation(monkeypatch)
  assert flags.run_checked(grpo.run, cfg) == 0
  line = re.search(
    r"^eval at step 4/4 \| (.*) \| (.*)$", capsys.readouterr().err, re.M
  )
  assert line and line[2] == "the finished run's (eval_after.json)", line
  assert "accuracy" in line[1]
  assert open(os.path.join(cfg.workdir, "eval_after.json")).read() == after
  assert open(os.path.join(cfg.workdir, "metrics.jsonl")).read() == rows
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "finished", "step": 4, "steps": 4}


def test_an_error_in_a_step_leaves_the_last_checkpoint_whole(
  tmp_path, monkeypatch, capsys
):
  """A reward function that fails in step 2, while checkpoint 1 is written
  in the background: the write is finished before the error ends the run
  (a process that exits with one in flight loses it), and the error is the
  one raised."""

  def hook(call, rewards):
    if call == 2:
      raise RuntimeError("the reward server went away")
    return rewards

  _hooked_rewards(monkeypatch, hook)
  cfg = _cfg(tmp_path, warm_start_steps=0, async_checkpoint=True)
  with pytest.raises(RuntimeError, match="the reward server went away"):
    grpo.run(cfg)
  err = capsys.readouterr().err
  assert "finishing checkpoint 1's write before stopping" in err
  assert os.listdir(os.path.join(cfg.workdir, "checkpoints")) == ["1"]
  assert list(testing.checkpoints(cfg.workdir)) == [1]
  assert _train_steps(cfg.workdir) == [1]


def test_ctrl_c_checkpoints_the_step_and_a_second_stops_at_once(
  tmp_path, monkeypatch, capsys
):
  """Ctrl-C during step 1 stops the run after it, with checkpoint 1 (exit
  75); on the rerun, Ctrl-C twice during step 2 raises KeyboardInterrupt
  at once: no checkpoint 2, and the handlers are the caller's again."""
  presses = {1: 1, 2: 2}  # reward call (one a step) -> Ctrl-Cs

  def hook(call, rewards):
    for _ in range(presses.get(call, 0)):
      os.kill(os.getpid(), signal.SIGINT)
    return rewards

  _hooked_rewards(monkeypatch, hook)
  before = signal.getsignal(signal.SIGINT)
  cfg = _cfg(tmp_path, steps=3, checkpoint_every=0)
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  assert "Ctrl-C: checkpointing and stopping at the next sampler call" in (
    capsys.readouterr().err
  )
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "stopped", "step": 1, "steps": 3}
  assert os.listdir(os.path.join(cfg.workdir, "checkpoints")) == ["1"]
  assert signal.getsignal(signal.SIGINT) is before
  with pytest.raises(KeyboardInterrupt):
    grpo.run(cfg)
  assert os.listdir(os.path.join(cfg.workdir, "checkpoints")) == ["1"]
  assert _train_steps(cfg.workdir) == [1]
  assert signal.getsignal(signal.SIGINT) is before


def test_a_time_limit_stops_the_run_as_a_signal_does(
  tmp_path, monkeypatch, capsys
):
  """--stop_after_hours sets the run's deadline that many hours from its
  start; once it passes (brought forward here in step 2) the run stops
  after the step with a checkpoint (exit 75), saying which limit. A
  nested Preemption (a warm start's) sees the same deadline."""
  seen = []

  def hook(call, rewards):
    if call == 2:
      deadline, limit = preemption._SIGNALLED["deadline"]  # noqa: SLF001
      seen.append((deadline - time.time(), limit))
      with preemption.Preemption() as nested:
        assert not nested.requested
      preemption._SIGNALLED["deadline"] = (time.time(), limit)  # noqa: SLF001
    return rewards

  _hooked_rewards(monkeypatch, hook)
  cfg = _cfg(tmp_path, steps=3, warm_start_steps=0, stop_after_hours=1.5)
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  [(left, limit)] = seen
  assert 0 < 5400 - left < 300 and limit == "--stop_after_hours=1.5"
  err = capsys.readouterr().err
  assert "--stop_after_hours=1.5 reached: checkpointing and stopping" in err
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "stopped", "step": 2, "steps": 3}
  with preemption.Preemption() as fresh:  # the next run's: no old limit
    assert not fresh.requested


def test_preemptions_share_a_signal_and_restore_handlers():
  """A signal caught by the run's Preemption is seen by one made inside
  it (its warm start's); a new run starts without it."""
  before = signal.getsignal(signal.SIGTERM)
  with preemption.Preemption() as run:
    os.kill(os.getpid(), signal.SIGTERM)
    assert run.requested and run.agreed()
    with preemption.Preemption() as warm_start:
      assert warm_start.requested
    assert signal.getsignal(signal.SIGTERM) == run._handle
  assert signal.getsignal(signal.SIGTERM) is before
  with preemption.Preemption() as later:
    assert not later.requested


def test_a_run_resumes_on_another_mesh_with_other_memory_settings(tmp_path):
  """What an out-of-memory error says to turn (micro-batches, remat, the
  mesh) may change on a resume: 2 steps over 8 devices, then the same run
  over 4 (2 x 2) with 2 micro-batches and remat resumes at step 2, its
  state restored into the new layout."""
  cfg = _cfg(tmp_path, steps=2, mesh_fsdp=8, checkpoint_every=0)
  grpo.run(cfg)
  moved = dataclasses.replace(
    cfg, steps=3, mesh_data=2, mesh_fsdp=2, micro_batches=2, remat=True
  )
  out = grpo.run(moved)
  assert (out["step"], out["stopped"]) == (3, False)
  assert _train_steps(cfg.workdir) == [1, 2, 3]
  mesh = out["state"].params["embedding"].sharding.mesh
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 1}
  saved = json.load(open(os.path.join(cfg.workdir, "config.json")))
  assert (saved["mesh_fsdp"], saved["micro_batches"]) == (2, 2)


def _no_evaluation(monkeypatch, allowed=0):
  """context.run_eval fails after `allowed` calls."""
  run_eval, calls = context_lib.run_eval, []

  def counted(*args, **kwargs):
    calls.append(1)
    assert len(calls) <= allowed, "evaluated again"
    return run_eval(*args, **kwargs)

  monkeypatch.setattr(context_lib, "run_eval", counted)
  return calls


def test_zero_steps_evaluate_once(tmp_path, monkeypatch, capsys):
  """--steps=0 scores the initial weights once: eval_after.json is
  eval_before.json's numbers."""
  calls = _no_evaluation(monkeypatch, allowed=1)
  cfg = _cfg(tmp_path, steps=0)
  assert flags.run_checked(grpo.run, cfg) == 0
  assert len(calls) == 1
  before, after = (
    json.load(open(os.path.join(cfg.workdir, f"eval_{w}.json")))
    for w in ("before", "after")
  )
  assert before == after and "eval/accuracy" in after
  assert (
    len(re.findall("^eval at step 0/0 ", capsys.readouterr().err, re.M)) == 1
  )


@pytest.mark.slow
def test_sigterm_during_the_warm_start_checkpoints_and_resumes_it(
  tmp_path, monkeypatch
):
  cfg = _cfg(tmp_path, warm_start_steps=6, warm_start_batch_size=4)
  straight = sft.warm_start(cfg, cache_dir=str(tmp_path / "straight"))

  def sigterm(step):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  _hooked_sft_steps(monkeypatch, sigterm)
  with pytest.raises(checkpoint.Stopped, match="stopped at step 3 of 6"):
    sft.warm_start(cfg)
  (partial,) = [d for d in os.listdir(cfg.cache_dir) if d.endswith(".partial")]
  out = sft.warm_start(cfg)  # resumes from step 3
  assert not os.path.exists(os.path.join(cfg.cache_dir, partial))
  _same_weights(straight, out)


def test_a_crashed_warm_start_resumes_from_its_last_periodic_save(
  tmp_path, monkeypatch
):
  """With a save due after every step (checkpoint.SAVE_SECONDS = 0), a
  warm start that crashes during step 4 (no signal: as the OOM killer
  would end it) resumes at step 3 on the rerun and ends with the weights
  of a run never stopped."""
  cfg = _cfg(tmp_path, warm_start_steps=6, warm_start_batch_size=4)
  straight = sft.warm_start(cfg, cache_dir=str(tmp_path / "straight"))
  monkeypatch.setattr(checkpoint, "SAVE_SECONDS", 0.0)

  def crash(step):
    if step == 4:
      raise RuntimeError("killed")

  calls = _hooked_sft_steps(monkeypatch, crash)
  with pytest.raises(RuntimeError, match="killed"):
    sft.warm_start(cfg)
  (partial,) = [d for d in os.listdir(cfg.cache_dir) if d.endswith(".partial")]
  checkpoints = os.listdir(os.path.join(cfg.cache_dir, partial))
  assert checkpoints == ["3"], checkpoints  # the last step saved, alone
  calls.clear()
  out = sft.warm_start(cfg)
  assert len(calls) == 3  # steps 4-6 only
  _same_weights(straight, out)


def test_a_failed_warm_start_restores_the_signal_handlers(
  tmp_path, monkeypatch
):
  """An error inside the warm start (its Resumable) puts the caller's
  SIGINT / SIGTERM handlers back, and the signal that came before it is
  not pending for the next run."""
  cfg = _cfg(tmp_path, warm_start_steps=6, warm_start_batch_size=4)

  def signal_then_fail(step):
    if step == 2:  # a signal, then an error before the step ends
      os.kill(os.getpid(), signal.SIGTERM)
      raise RuntimeError("disk on fire")

  _hooked_sft_steps(monkeypatch, signal_then_fail)
  before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
  with pytest.raises(RuntimeError, match="disk on fire"):
    sft.warm_start(cfg)
  after = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
  assert after == before
  with preemption.Preemption() as fresh:
    assert not fresh.requested


class _Stop(Exception):
  pass


@pytest.mark.parametrize("micro_batches, warned", [(4, True), (2, False)])
def test_a_micro_batch_that_does_not_split_is_warned_before_the_model(
  tmp_path, monkeypatch, caplog, micro_batches, warned
):
  """16 rows in one minibatch over 8 batch shards: 4 micro-batches of 4
  rows do not split (activations kept whole on groups of chips), 2 of 8 do."""

  def stop(*a, **kw):
    raise _Stop

  monkeypatch.setattr("rlreason.train.loop.loaders.load_model", stop)
  cfg = _cfg(
    tmp_path,
    mesh_fsdp=-1,
    minibatches=1,
    micro_batches=micro_batches,
    warm_start_steps=0,
  )
  assert cfg.num_sequences == 16
  with pytest.raises(_Stop):
    grpo.run(cfg)
  line = "4 rows per micro-batch do not split over 8 chips"
  assert (line in caplog.text) == warned, caplog.text
  assert ("--micro_batches=2 splits them" in caplog.text) == warned


def test_a_rollout_tensor_that_does_not_divide_the_mesh_stops_the_run(
  tmp_path, monkeypatch
):
  """--rollout_tensor=3 over 8 devices: an error naming the flag and the
  mesh before the model loads."""

  def stop(*a, **kw):
    raise _Stop

  monkeypatch.setattr("rlreason.train.loop.loaders.load_model", stop)
  cfg = _cfg(tmp_path, mesh_fsdp=-1, rollout_tensor=3, warm_start_steps=0)
  with pytest.raises(ValueError, match=r"--rollout_tensor=3 must divide the 8"):
    grpo.run(cfg)
  cfg = _cfg(tmp_path, mesh_fsdp=-1, rollout_tensor=4, warm_start_steps=0)
  with pytest.raises(_Stop):
    grpo.run(cfg)


def test_an_interrupted_evaluation_resumes_after_its_journal(
  tmp_path, monkeypatch, capsys
):
  """The final evaluation (12 problems x 4 samples, 4 problems a sampler
  call) stopped as its second call starts: the rerun scores the last 8
  problems only and writes the numbers of a run never stopped; the
  journal goes once the evaluation is done."""
  kw = dict(steps=1, eval_samples=4, eval_size=12, warm_start_steps=0)
  whole = _cfg(tmp_path, "whole", **kw)
  grpo.run(whole)
  assert not os.path.exists(os.path.join(whole.workdir, "eval_partial"))
  cfg = _cfg(tmp_path, **kw)
  generate = context_lib.Context.generate

  def stopped(self, params, examples, rng, step, **k):
    if step == cfg.steps and k.get("row_offset"):  # the final evaluation's
      raise KeyboardInterrupt
    return generate(self, params, examples, rng, step, **k)

  with monkeypatch.context() as m:
    m.setattr(context_lib.Context, "generate", stopped)
    with pytest.raises(KeyboardInterrupt):
      grpo.run(cfg)
  partial = os.path.join(cfg.workdir, "eval_partial")
  assert [
    len(open(os.path.join(partial, f)).readlines()) for f in os.listdir(partial)
  ] == [4]
  capsys.readouterr()
  grpo.run(cfg)
  err = capsys.readouterr().err
  assert re.search(
    r"^eval: 4 of 12 problems from .*/step_1-\w+\.jsonl$", err, re.M
  ), err
  assert not os.path.exists(partial)
  after = [
    json.load(open(os.path.join(c.workdir, "eval_after.json")))
    for c in (cfg, whole)
  ]
  assert after[0] == after[1] and after[0]["problems"] == 12


@pytest.mark.slow
def test_a_stop_within_a_rollout_or_an_evaluation_resumes_as_one_run(
  tmp_path, monkeypatch, capsys
):
  """Ctrl-C lands in a sampler call (2 of 8 rows each; an evaluation
  chunk is 4 problems x 4 samples, in 2 calls). In step 1's rollout: the
  run stops after that call, checkpointed at 0 (the step's start; no
  periodic checkpoints). Rerun, in the mid-run evaluation at step 2, as its
  first chunk's last call runs: stopped after the chunk, with checkpoint 2
  (metrics.jsonl has no evaluation at 2). The next rerun finishes it from
  its journal first and is stopped in step 3's rollout; the next one does
  not evaluate at 2 again, and is stopped in the final evaluation; the
  last finishes it. A stopped rollout's finished call is kept (its
  journal): the rerun samples the other. Metrics, final evaluation and
  weights are a run never stopped's."""
  kw = dict(
    steps=3,
    eval_every=2,
    eval_samples=4,
    eval_size=8,
    rollout_rows=8,
    rollout_batching="static",
    checkpoint_every=0,
    warm_start_steps=0,
    reward=testing.register_digits_reward(),  # the weights move at once
  )
  whole = _cfg(tmp_path, "whole", **kw)
  grpo.run(whole)
  cfg = _cfg(tmp_path, **kw)
  calls, press_at = [], []
  real = context_lib.rollout_lib._sample_rows

  def sample_rows(*args, **kwargs):
    calls.append(1)
    if len(calls) in press_at:
      os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)

  monkeypatch.setattr(context_lib.rollout_lib, "_sample_rows", sample_rows)
  # Calls 1-4: the evaluation at 0; 5: step 1's rollout.
  press_at[:] = [5]
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  assert len(calls) == 5
  assert "step 1/3 stopped during its sampling" in capsys.readouterr().err
  ckpts = os.path.join(cfg.workdir, "checkpoints")
  assert os.listdir(ckpts) == ["0"] and _train_steps(cfg.workdir) == []
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "stopped", "step": 0, "steps": 3}
  # Step 1's first call is in its rollout journal (named by the step and
  # the settings).
  partial = os.path.join(cfg.workdir, "rollout_partial")
  (step_dir,) = os.listdir(partial)
  assert re.fullmatch(r"step_0-\w{16}", step_dir), step_dir
  (kept,) = os.listdir(os.path.join(partial, step_dir))
  # A later step's (a killed run's past its checkpoint) is of weights the
  # rerun does not have: removed as it starts.
  os.makedirs(os.path.join(partial, "step_1" + step_dir[6:], "rollout"))
  # Resumed at 0, its evaluation done: call 1 is the rest of step 1's
  # rollout, 2-3 step 2's, 4-5 the evaluation's first chunk.
  calls.clear()
  press_at[:] = [5]
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  assert len(calls) == 5
  err = capsys.readouterr().err
  assert re.search(
    rf"^rollout: 8 of 16 sequences from .*/{step_dir}/{kept}$", err, re.M
  ), err
  assert not os.path.exists(os.path.join(cfg.workdir, "rollout_partial"))
  assert "eval at step 0/3" not in err
  assert "eval at step 2/3 stopped after" in err
  assert sorted(os.listdir(ckpts)) == ["0", "2"]
  assert _train_steps(cfg.workdir) == [1, 2]
  # Calls 1-2: the evaluation's second chunk; 3: step 3's rollout.
  calls.clear()
  press_at[:] = [3]
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  err = capsys.readouterr().err
  assert re.search(
    r"^eval: 4 of 8 problems from .*/step_2-\w+\.jsonl$", err, re.M
  ), err
  assert re.search(r"^eval at step 2/3 \| accuracy ", err, re.M), err
  assert "step 3/3 stopped during its sampling" in err
  # Resumed at 2 again, its evaluation done (metrics.jsonl): call 1 is the
  # rest of step 3's rollout, 2-3 the final evaluation's first chunk.
  calls.clear()
  press_at[:] = [3]
  assert flags.run_checked(grpo.run, cfg) == flags.EXIT_STOPPED
  err = capsys.readouterr().err
  assert "eval at step 2/3" not in err and len(calls) == 3
  assert "rollout: 8 of 16 sequences from" in err
  assert "eval at step 3/3 stopped after" in err
  assert not os.path.exists(os.path.join(cfg.workdir, "eval_after.json"))
  status = json.load(open(os.path.join(cfg.workdir, "status.json")))
  assert status == {"status": "stopped", "step": 3, "steps": 3}
  press_at[:] = []
  assert flags.run_checked(grpo.run, cfg) == 0
  assert re.search(
    r"^eval: 4 of 8 problems from .*/step_3-\w+\.jsonl$",
    capsys.readouterr().err,
    re.M,
  )
  assert not os.path.exists(os.path.join(cfg.workdir, "eval_partial"))
  assert not os.path.exists(os.path.join(cfg.workdir, "rollout_partial"))

  def rows(c):  # train and evaluation rows, without wall-clock fields
    out = metrics.read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
    clock = ("time", "tokens_per_sec")
    return [
      {k: v for k, v in r.items() if not k.startswith(clock)} for r in out
    ]

  assert rows(cfg) == rows(whole) and len(rows(whole)) == 6  # 3 + 3 evals
  after = [
    json.load(open(os.path.join(c.workdir, "eval_after.json")))
    for c in (cfg, whole)
  ]
  assert after[0] == after[1]
  jax.tree.map(
    np.testing.assert_array_equal,
    _params(cfg.workdir, 3),
    _params(whole.workdir, 3),
  )
  assert all(
    r["grad_norm"] > 0 for r in testing.train_rows(whole.workdir).values()
  )


def test_a_stop_between_sampling_rounds_keeps_the_finished_rollout(
  tmp_path, monkeypatch, capsys
):
  """DAPO's dynamic sampling with every reward 0 (no informative group:
  3 rounds a step). Ctrl-C while step 1's first round is scored: the next
  round does not start (stopped during its sampling); the first round's
  rollout, ended, is kept whole, so the rerun samples none of its rows and
  the run's metrics are a run never stopped's."""
  from experiments import dapo

  kw = dict(
    steps=2,
    eval_every=0,
    warm_start_steps=0,
    checkpoint_every=0,
    overlong_penalty=0.0,  # (every reward 0)
  )
  press = []

  def zero(call, rewards):
    if call in press:
      os.kill(os.getpid(), signal.SIGINT)
    return np.zeros_like(rewards)

  _hooked_rewards(monkeypatch, zero)
  whole = dataclasses.replace(dapo.Config(), **{**vars(_cfg(tmp_path, "w"))})
  whole = dataclasses.replace(whole, **kw)
  dapo.run(whole)
  cfg = dataclasses.replace(whole, workdir=str(tmp_path / "run"))
  press[:] = [7]  # the hook counts on: 3 calls a step, then this run's
  assert flags.run_checked(dapo.run, cfg) == flags.EXIT_STOPPED
  assert "step 1/2 stopped during its sampling" in capsys.readouterr().err
  (step_dir,) = os.listdir(os.path.join(cfg.workdir, "rollout_partial"))
  assert step_dir.startswith("step_0-"), step_dir
  (kept,) = os.listdir(os.path.join(cfg.workdir, "rollout_partial", step_dir))
  press[:] = []
  assert flags.run_checked(dapo.run, cfg) == 0
  err = capsys.readouterr().err
  assert re.search(rf"^rollout: 16 of 16 sequences from .*/{kept}$", err, re.M)
  assert not os.path.exists(os.path.join(cfg.workdir, "rollout_partial"))
  clock = ("time", "tokens_per_sec")
  rows = [
    [
      {k: v for k, v in r.items() if not k.startswith(clock)}
      for r in metrics.read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
    ]
    for c in (cfg, whole)
  ]
  assert rows[0] == rows[1]
  rounds = [r["dynamic/rounds"] for r in rows[0] if "dynamic/rounds" in r]
  assert rounds == [3, 3]


def test_an_accelerator_run_logs_the_updates_mfu(tmp_path, monkeypatch):
  """Where the devices' peak is known (a GPU or TPU: faked here), each
  step's row holds "mfu/update": the policy's model FLOPs over all the
  updates (6 per parameter + attention per token, PaLM's) at the batch's
  shape, over time/update times the peak. A CPU's rows have none."""
  monkeypatch.setattr(loop_lib.devices, "peak_flops", lambda: 2e9)
  seen = testing.spy(
    monkeypatch,
    loop_lib.metrics_lib,
    "step_row",
    lambda u, b, rollout, times, flops=None: (rollout.tokens.shape, flops),
  )
  cfg = _cfg(tmp_path, steps=1, warm_start_steps=0, ppo_epochs=2)
  grpo.run(cfg)
  [((n, width), (flops, peak))] = seen
  model_cfg = loaders.model_config(cfg)
  assert n == cfg.num_sequences and peak == 2e9
  assert flops == transformer.flops_per_token(model_cfg, width) * n * width * 2
  [row] = [
    r
    for r in metrics.read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
    if "loss" in r
  ]
  want = flops / (row["time/update"] * peak)
  assert row["mfu/update"] == pytest.approx(want, rel=1e-6, abs=0)
  monkeypatch.setattr(loop_lib.devices, "peak_flops", lambda: None)
  cpu = _cfg(tmp_path, "cpu", steps=1, warm_start_steps=0)
  grpo.run(cpu)
  rows = metrics.read_jsonl(os.path.join(cpu.workdir, "metrics.jsonl"))
  assert not any("mfu/update" in r for r in rows)


def test_a_multi_turn_warm_start_keeps_whole_episodes(monkeypatch, tmp_path):
  """loop.warm_started_on_episodes: the run's inputs are checked first, then the
  warm start's demonstrations are cut at the episode's T tokens (search_r1:
  3 actions of 32 + 2 results of 40 = 176), not at --max_new_tokens (64),
  which cut 886 of the 900 1-hop kbqa demonstrations before their answer's
  end and every 2-hop one (110-117 characters) before its answer."""
  from experiments import search_r1
  from rlreason.train import preflight

  calls = []
  monkeypatch.setattr(
    preflight,
    "check_run",
    lambda cfg, name, ref=None: calls.append(("check", name)),
  )

  def warm_start(cfg):
    calls.append(("warm_start", cfg.max_new_tokens))
    return "ws"

  monkeypatch.setattr(sft, "warm_start", warm_start)
  cfg = search_r1.Config(workdir=str(tmp_path))
  got = loop_lib.warm_started_on_episodes(cfg, "search_r1")
  assert calls == [("check", "search_r1"), ("warm_start", 176)]
  assert got.init_from == "ws" and got.max_new_tokens == cfg.max_new_tokens


@pytest.mark.parametrize(
  "overrides, checked",
  [({}, True), (dict(warm_start_steps=0), False), (dict(init_from="m"), False)],
)
def test_the_inputs_are_checked_before_a_warm_start_only(
  monkeypatch, overrides, checked
):
  """loop.warm_started checks the run before a warm start of its own (dler,
  truncated_ppo, the multi-turn runs); with none to run, train() checks it,
  once."""
  from rlreason.train import preflight

  calls = []
  monkeypatch.setattr(
    preflight, "check_run", lambda cfg, name, ref: calls.append(name)
  )
  monkeypatch.setattr(sft, "warm_start", lambda cfg: "ws")
  cfg = dataclasses.replace(grpo.TinyConfig(), **overrides)
  got = loop_lib.warm_started(cfg, "grpo", max_new_tokens=5)
  assert calls == (["grpo"] if checked else [])
  assert got.init_from == ("ws" if checked else cfg.init_from)
