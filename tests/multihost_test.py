"""Multi-process: 2 processes x 2 CPU devices == 1 process x 4 devices.

Two processes on 127.0.0.1 (jax.distributed, gloo CPU collectives; set up by
run_info.maybe_initialize_distributed from the environment, as on a cluster)
run a few GRPO steps (warm start, rollouts, updates, per-step checkpoints,
evaluation) in one shared workdir. A single process with 4 simulated devices
runs the same config on the same mesh. Metrics and final parameters match,
and only process 0 writes the logs.

Each run is a subprocess of tests/multihost_worker.py, in its own process
group, killed when it outlives its time limit.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlreason import testing
from rlreason.eval import trained

# One worker runs the module (--dist=loadgroup, pyproject.toml): the module
# fixture's runs would otherwise repeat on each worker.
pytestmark = pytest.mark.xdist_group("multihost")

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
# Generous: two processes of 2 devices each share a loaded 2-core machine.
TIMEOUT_S = 420

CONFIG = dict(
  testing.SMOKE,
  steps=3,
  reward="digits",  # registered by the worker: non-zero advantages at once
  # 4 devices: 2 processes x 2, or 1 process x 4. FSDP over all of them puts
  # every parameter and the batch across both processes.
  mesh_fsdp=4,
  # The sampler on its own (1, 2, 2) mesh (mesh.rollout_mesh): its weights
  # resharded from FSDP across both processes every step, its rows handed
  # back to the run's mesh.
  rollout_tensor=2,
  # 16 rows through 8 continuous-batching slots, in host calls of 4 decode
  # steps (multihost_worker.py): every process must split the sampler's
  # loop alike, and only process 0 prints the progress lines.
  rollout_rows=8,
)

# Values that differ between runs by nature, not by computation.
WALL_CLOCK = ("time", "tokens_per_sec")


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("JAX_", "RLREASON_"))
  }
  env.update(
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=testing.xla_flags(
      devices,
      # XLA:CPU aborts a collective whose participants are more than 40 s
      # apart; under load on a shared 2-core machine they can be.
      "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120",
      "--xla_cpu_collective_call_terminate_timeout_seconds=300",
    ),
    **extra,
  )
  return env


def _run_all(runs, timeout=TIMEOUT_S):
  """Starts (args, env, log path) runs together; waits for all to succeed.

  On a failure or the time limit, every run still alive is killed (its
  whole process group: reward pools included) and the test fails with the
  tail of each log.
  """
  procs = []
  for args, env, log in runs:
    with open(log, "w") as f:
      procs.append(
        subprocess.Popen(
          [sys.executable, WORKER, *args],
          env=env,
          stdout=f,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
      )
  deadline = time.monotonic() + timeout
  failed = None
  try:
    while any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs):
        failed = "a process failed"
        break
      if time.monotonic() > deadline:
        failed = f"timed out after {timeout} s"
        break
      time.sleep(0.2)
    else:
      if any(p.returncode for p in procs):
        failed = "a process failed"
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  if failed:
    tails = []
    for (_, _, log), p in zip(runs, procs):
      with open(log) as f:
        tails.append(f"--- {log} (exit {p.returncode}):\n{f.read()[-3000:]}")
    pytest.fail(f"{failed}\n" + "\n".join(tails))


def _run_two_processes(tmp, name, mode, overrides, **env):
  """multihost_worker.py `mode` over 2 processes x 2 CPU devices, joined
  by jax.distributed on loopback as on a cluster: outputs and logs at
  tmp/<name><process>.*."""
  port = _free_port()
  _run_all(
    [
      (
        [mode, json.dumps(overrides), str(tmp / f"{name}{i}")],
        _env(
          2,
          RLREASON_MULTIHOST="1",
          JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
          JAX_NUM_PROCESSES="2",
          JAX_PROCESS_ID=str(i),
          RLREASON_DISTRIBUTED_TIMEOUT="120",
          **env,
        ),
        tmp / f"{name}{i}.log",
      )
      for i in range(2)
    ]
  )


def _train_rows(workdir):
  rows = [
    json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))
  ]
  return [
    {k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)} for r in rows
  ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The two-process run, then the single-process reference.

  They share the warm-start cache: the two processes compute and write it
  (exercising the multi-process warm start), the reference reuses it, so the
  RL steps start from the same parameters. (Run separately, the two warm
  starts differ by float rounding in the all-reduce order, which Adam
  amplifies to ~1e-5.)
  """
  tmp = tmp_path_factory.mktemp("multihost")
  cache = str(tmp / "cache")
  multi = dict(CONFIG, workdir=str(tmp / "multi"), cache_dir=cache)
  _run_two_processes(tmp, "proc", "grpo", multi)
  single = dict(CONFIG, workdir=str(tmp / "single"), cache_dir=cache)
  _run_all(
    [
      (
        ["grpo", json.dumps(single), str(tmp / "single")],
        _env(4),
        tmp / "single.log",
      )
    ]
  )
  return tmp


def test_processes_see_the_global_mesh(runs):
  for i in range(2):
    info = json.load(open(runs / f"proc{i}.json"))
    assert info["process_index"] == i
    assert info["process_count"] == 2
    assert info["device_count"] == 4
  single = json.load(open(runs / "single.json"))
  assert (single["process_count"], single["device_count"]) == (1, 4)


def test_metrics_match_single_process(runs):
  single, multi = _train_rows(runs / "single"), _train_rows(runs / "multi")
  # Written once per step: process 1 wrote no rows of its own.
  assert [r["step"] for r in multi] == [r["step"] for r in single]
  assert [r["step"] for r in single] == [0, 1, 2, 3, 3]
  assert any(r.get("grad_norm", 0) > 0 for r in single)  # the params moved
  for a, b in zip(single, multi):
    assert sorted(a) == sorted(b)
    for k in a:
      np.testing.assert_allclose(
        b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {k}"
      )


def test_final_params_match_single_process(runs):
  single = np.load(runs / "single.npz")
  p0, p1 = np.load(runs / "proc0.npz"), np.load(runs / "proc1.npz")
  assert sorted(single) == sorted(p0) == sorted(p1)
  for k in single:
    # Exact: both processes gather the same (global) array.
    np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
    np.testing.assert_allclose(
      p0[k], single[k], rtol=1e-5, atol=1e-6, err_msg=k
    )


def _checkpoint(workdir, step):
  """(params as numpy, meta) of a run's checkpoint, restored in this process."""
  step_dir = os.path.join(workdir, "checkpoints", str(step))
  checkpointer = ocp.StandardCheckpointer()
  saved = checkpointer.metadata(os.path.join(step_dir, "state"))
  cpu = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(
    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu),
    saved.item_metadata,
  )
  state = checkpointer.restore(os.path.join(step_dir, "state"), target)
  with open(os.path.join(step_dir, "meta", "metadata")) as f:
    meta = json.load(f)
  return jax.tree.map(np.asarray, state["params"]), meta


def test_checkpoint_written_by_both_processes_restores(runs):
  multi, meta = _checkpoint(runs / "multi", CONFIG["steps"])
  single, single_meta = _checkpoint(runs / "single", CONFIG["steps"])
  assert meta == single_meta
  final = np.load(runs / "proc0.npz")
  flat = {
    jax.tree_util.keystr(path): x
    for path, x in jax.tree_util.tree_leaves_with_path(multi)
  }
  assert sorted(flat) == sorted(final)
  for k, x in flat.items():
    np.testing.assert_array_equal(x, final[k], err_msg=k)  # saved, restored
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    multi,
    single,
  )


def test_only_process_0_prints_the_rollout_progress(runs):
  pattern = re.compile(r"^step \d/3: rollout sequences \d+/16 \|", re.M)
  logs = [open(runs / f"proc{i}.log").read() for i in range(2)]
  assert len(pattern.findall(logs[0])) >= 3, logs[0][-3000:]
  assert not pattern.findall(logs[1]), logs[1][-3000:]


def test_only_process_0_writes(runs):
  multi = runs / "multi"
  for f in (
    "config.json",
    "COMMIT",
    "metrics.jsonl",
    "eval_before.json",
    "eval_after.json",
    "report.md",
  ):
    assert (multi / f).exists(), f
  # MetricWriter appends: a second writer would have duplicated every row.
  steps = [r["step"] for r in _train_rows(multi)]
  assert steps == [0, 1, 2, 3, 3]
  # The warm start was written once, atomically, into the shared cache
  # (beside xla/: the compiled programs, --compile_cache=auto).
  names = [p.name for p in (runs / "cache").iterdir() if p.name != "xla"]
  assert len(names) == 1 and names[0].startswith("sft-"), names


def test_a_sigterm_to_one_process_stops_both_at_the_same_point(runs):
  """Process 1 alone gets SIGTERM as step 3's rollout starts (sampler call
  4: the evaluation at step 0 is the first), as when one host of a slice
  is preempted first: both processes agree on it between the sampler's
  host calls, checkpoint step 2 together (no periodic checkpoints) and
  stop there (a save on one alone would hang). The rerun, over both
  processes, resumes step 3's rollout from process 0's journal and ends
  where a run never stopped does."""
  workdir = runs / "stopped"
  cfg = dict(
    CONFIG,
    checkpoint_every=0,
    workdir=str(workdir),
    cache_dir=str(runs / "cache"),
  )
  _run_two_processes(
    runs, "stopped", "grpo", cfg, RLREASON_TEST_SIGTERM_AT="1:4:5"
  )
  for i in range(2):
    out = json.load(open(runs / f"stopped{i}.json"))
    assert (out["stopped"], out["step"]) == (1.0, 2.0), out
  status = json.load(open(workdir / "status.json"))
  assert status == {"status": "stopped", "step": 2, "steps": 3}
  assert os.listdir(workdir / "checkpoints") == ["2"]
  assert [r["step"] for r in _train_rows(workdir)] == [0, 1, 2]
  log = open(runs / "stopped0.log").read()
  assert "step 3/3 stopped during its sampling" in log, log
  # The rows step 3's rollout finished are kept (process 0's disk): the
  # rerun samples the rest; its rows are the run never stopped's.
  (step_dir,) = os.listdir(workdir / "rollout_partial")
  assert step_dir.startswith("step_2-"), step_dir
  (kept,) = os.listdir(workdir / "rollout_partial" / step_dir)
  _run_two_processes(runs, "resumed", "grpo", cfg)
  log = open(runs / "resumed0.log").read()
  assert re.search(rf"^rollout: \d+ of 16 sequences from .*{kept}$", log, re.M)
  assert not (workdir / "rollout_partial").exists()
  # The rerun's rows are sampled in other slots than the first time: the
  # sampler's log-probs (so approx_kl, the loss) move at float rounding.
  resumed, whole = _train_rows(workdir), _train_rows(runs / "multi")
  assert [r.keys() for r in resumed] == [r.keys() for r in whole]
  for r, w in zip(resumed, whole):
    for k in r:
      np.testing.assert_allclose(r[k], w[k], rtol=1e-3, atol=1e-6, err_msg=k)


def _evaluate_2_processes(tmp, name, flags, **env):
  """experiments.evaluate over 2 processes x 2 devices; each one's
  multihost_worker.py record (sampler calls, stopped) and log."""
  _run_two_processes(tmp, name, "evaluate", flags, **env)
  return [
    (
      json.load(open(tmp / f"{name}{i}.json")),
      open(tmp / f"{name}{i}.log").read(),
    )
    for i in range(2)
  ]


def test_an_interrupted_multihost_evaluation_resumes_where_it_stopped(
  tmp_path,
):
  """experiments.evaluate --multihost: process 0 alone writes the files and
  the journals (partial/) and, on the rerun, shares what they hold, so both
  processes start after the same problems: the rerun decodes only the rest
  and writes the files of a run never interrupted. The stop: SIGTERM to
  process 1 alone (one host preempted), which both agree on."""
  flags = dict(
    checkpoint="tiny",
    data="task:arithmetic:difficulty=1",
    num_problems=8,
    samples=4,
    max_prompt_len=32,
    max_new_tokens=16,
    sequences_per_call=8,  # greedy: one chunk of 8; 4 samples: 4 chunks
    compile_cache=str(tmp_path / "xla"),
  )
  whole, out = tmp_path / "whole", tmp_path / "again"
  # The uninterrupted run also exports the model: every process gathers
  # each tensor in turn (hf.save), process 0 writes.
  exported = tmp_path / "hf"
  runs = _evaluate_2_processes(
    tmp_path, "whole", dict(flags, out=str(whole), export_hf=str(exported))
  )
  for record, _ in runs:
    assert record == {"calls": [0, 0, 8, 16, 24], "stopped": False}
  assert "Exported HF checkpoint" in runs[0][1]
  assert "Exported" not in runs[1][1]
  # The same preset and seed exported by this one process, byte for byte.
  single = trained.export_hf("tiny", str(tmp_path / "hf_single"))
  for name in ("model.safetensors", "config.json"):
    got = (exported / name).read_bytes()
    assert got == open(os.path.join(single, name), "rb").read(), name
  # SIGTERM to process 1 as the sampled decoding's second chunk starts:
  # both finish that chunk (one sampler call), keep it and stop.
  stopped = _evaluate_2_processes(
    tmp_path,
    "stopped",
    dict(flags, out=str(out)),
    RLREASON_TEST_SIGTERM_AT="1:3",
  )
  for record, _ in stopped:
    assert record == {"calls": [0, 0, 8], "stopped": True}
  assert "Stopped: the finished problems are kept" in stopped[0][1]
  journals = {p.name.split("-")[0] for p in (out / "partial").iterdir()}
  assert journals == {"greedy", "n4"}
  (main, main_log), (other, other_log) = _evaluate_2_processes(
    tmp_path, "resumed", dict(flags, out=str(out))
  )
  for record in (main, other):  # the sampled problems 4-7 only
    assert record == {"calls": [16, 24], "stopped": False}
  assert "eval: 4 of 8 problems from" in main_log
  assert "problems from" not in other_log and "Wrote" not in other_log
  assert not (out / "partial").exists()
  for name in ("eval.json", "samples.jsonl"):
    assert (out / name).read_text() == (whole / name).read_text()
