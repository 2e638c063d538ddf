"""launch/: dry runs print the expected commands; shellcheck passes."""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rlreason import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
SCRIPTS = [
  "tpu.sh",
  "gpu.sh",
  "local.sh",
  "slurm.sbatch",
  "env.sh",
  "common.sh",
]
# A 4-worker v4 slice with settings that appear nowhere else.
ENV = dict(
  PROJECT="proj-x",
  ZONE="zone-y",
  TPU_NAME="slice-z",
  ACCELERATOR_TYPE="v4-32",
  NODES="4",
  GPUS_PER_NODE="8",
  SLURM_PARTITION="part-q",
)


def _run(*args, env=None):
  out = subprocess.run(
    ["bash", *args],
    cwd=ROOT,
    env={**os.environ, **ENV, **(env or {})},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert out.returncode == 0, out.stderr
  return out.stdout


def _commands(stdout):
  """The printed commands ('+ ...' lines) as argument lists."""
  return [shlex.split(l[2:]) for l in stdout.splitlines() if l.startswith("+ ")]


def test_shellcheck_passes():
  shellcheck = shutil.which("shellcheck")
  assert shellcheck, "shellcheck missing: pip install -e '.[test]'"
  out = subprocess.run(
    [shellcheck, "-x", *SCRIPTS],
    cwd=LAUNCH,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stdout + out.stderr


def test_tpu_create_and_delete():
  (create,) = _commands(_run("launch/tpu.sh", "--dry-run", "create"))
  assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
  for flag in (
    "slice-z",
    "--accelerator-type=v4-32",
    "--project=proj-x",
    "--zone=zone-y",
  ):
    assert flag in create
  (delete,) = _commands(_run("launch/tpu.sh", "--dry-run", "delete"))
  assert delete[4:6] == ["delete", "slice-z"] and "--quiet" in delete


@pytest.mark.parametrize(
  "accelerator, workers",
  [
    ("v4-8", 1),
    ("v4-32", 4),
    ("v5p-128", 16),
    ("v5litepod-16", 4),
    ("v6e-8", 1),
  ],
)
def test_worker_count(accelerator, workers):
  out = _run("launch/tpu.sh", "workers", env={"ACCELERATOR_TYPE": accelerator})
  assert int(out) == workers


def test_tpu_sync_ships_the_head_commit():
  head = subprocess.run(
    ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
  ).stdout.strip()
  archive, scp, unpack = _commands(_run("launch/tpu.sh", "--dry-run", "sync"))
  assert archive[:3] == ["git", "-C", ROOT] and archive[-1] == head
  assert scp[4] == "scp" and "--worker=all" in scp
  command = [a for a in unpack if a.startswith("--command=")][0]
  assert f"tar xzf rlreason-{head}.tar.gz" in command
  assert f"echo {head} > $HOME/rlreason/COMMIT" in command


def test_tpu_run_starts_every_worker_in_our_tmux_session():
  out = _run(
    "launch/tpu.sh",
    "--dry-run",
    "run",
    "experiments.grpo",
    "--scale=paper",
    "--note=it's quoted",
  )
  (ssh,) = _commands(out)
  assert ssh[4:6] == ["ssh", "slice-z"] and "--worker=all" in ssh
  remote = [a for a in ssh if a.startswith("--command=")][0]
  job = shlex.split(remote.split("tmux new-session -d -s rlreason ", 1)[1])[0]
  assert job.startswith(
    "trap : INT; cd $HOME/rlreason && RLREASON_MULTIHOST=1 python3 -m"
  )
  argv = shlex.split(job.split(" -m ", 1)[1].split(" 2>&1 ")[0])
  assert argv == ["experiments.grpo", "--scale=paper", "--note=it's quoted"]
  # A second `run` refuses to start beside a running one.
  assert "tmux has-session -t rlreason" in remote


def test_tpu_kill_ends_only_our_session():
  (ssh,) = _commands(_run("launch/tpu.sh", "--dry-run", "kill"))
  assert "--worker=all" in ssh
  remote = _remote("kill")
  assert "tmux kill-session -t rlreason" in remote
  assert not re.search(r"\b(pkill|killall|kill -9)\b", remote)


_PROBE = """
import sys, time
from rlreason.train import preemption
with preemption.Preemption() as preempt:
  for step in range(1, 1200):
    time.sleep(0.1)
    print("step", step, flush=True)
    if preempt.requested:
      print("checkpointed at", step, flush=True)
      sys.exit(75)
"""


def _remote(*args, **env):
  """The command `launch/tpu.sh --dry-run ARGS` has every worker run."""
  (ssh,) = _commands(_run("launch/tpu.sh", "--dry-run", *args, env=env))
  return [a for a in ssh if a.startswith("--command=")][0][len("--command=") :]


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_tpu_stop_is_ctrl_c_to_the_run_alone(tmp_path):
  """`run`'s and `stop`'s worker commands, run here as on a worker (a
  private tmux server, $HOME a temporary directory): the run gets SIGINT,
  finishes its step and exits 75 (its Preemption), while its shell and tee
  live on, so its last lines reach the log; the session then ends."""
  home = tmp_path / "home"
  (home / "rlreason").mkdir(parents=True)
  (home / "rlreason" / "probe.py").write_text(_PROBE)
  env = {
    **os.environ,
    "HOME": str(home),
    "TMUX_TMPDIR": str(tmp_path),
    "PYTHONPATH": ROOT,
    "JAX_PLATFORMS": "cpu",
  }

  def on_worker(command):
    subprocess.run(["bash", "-c", command], env=env, check=True, timeout=30)

  def session_alive():
    has = ["tmux", "has-session", "-t", "rlreason"]
    return subprocess.run(has, env=env, capture_output=True).returncode == 0

  on_worker(_remote("run", "probe", PYTHON=shlex.quote(sys.executable)))
  log = home / "rlreason-logs" / "run.log"
  _wait_for(lambda: log.exists() and "step 3\n" in log.read_text())
  on_worker(_remote("stop"))
  _wait_for(lambda: "checkpointed at" in log.read_text())
  _wait_for(lambda: not session_alive())
  lines = log.read_text().splitlines()
  assert lines[-1].startswith("checkpointed at"), lines[-3:]
  assert int(lines[-1].split()[-1]) < 1199  # stopped, not finished


def _wait_for(ok, timeout=60.0):
  deadline = time.monotonic() + timeout
  while not ok():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.1)


def test_slurm_stop_sends_sigterm_to_the_job():
  (cmd,) = _commands(_run("launch/gpu.sh", "--dry-run", "stop", "123"))
  assert cmd == ["scancel", "--signal=TERM", "123"]


def test_slurm_submit_prints_sbatch_and_srun_for_4_nodes():
  out = _run(
    "launch/gpu.sh", "--dry-run", "submit", "experiments.grpo", "--scale=paper"
  )
  cmds = _commands(out)
  sbatch = [c for c in cmds if c[0] == "sbatch"][0]
  for flag in ("--nodes=4", "--gpus-per-node=8", "--partition=part-q"):
    assert flag in sbatch
  assert "--signal=TERM@900" in sbatch  # time to checkpoint before the limit
  assert sbatch[-3:] == [
    os.path.join(LAUNCH, "slurm.sbatch"),
    "experiments.grpo",
    "--scale=paper",
  ]
  srun = [c for c in cmds if c[0] == "srun"][0]
  assert "--nodes=4" in srun and "--ntasks-per-node=1" in srun
  assert srun[-4:] == ["python3", "-m", "experiments.grpo", "--scale=paper"]
  assert "RLREASON_MULTIHOST=1" in srun


def test_local_dry_run_starts_n_processes_on_loopback():
  out = _run(
    "launch/local.sh",
    "--dry-run",
    "2",
    "experiments.grpo",
    "--steps=2",
    env={"PORT": "12345", "XLA_FLAGS": "--xla_dump_to=/d"},
  )
  procs = [c for c in _commands(out) if c[0] == "timeout"]
  assert len(procs) == 2
  for i, cmd in enumerate(procs):
    assert "JAX_COORDINATOR_ADDRESS=127.0.0.1:12345" in cmd
    assert f"JAX_PROCESS_ID={i}" in cmd and "JAX_NUM_PROCESSES=2" in cmd
    # The caller's XLA flags first: the device count set here wins.
    flags = next(a for a in cmd if a.startswith("XLA_FLAGS=")).split()
    assert flags[:2] == [
      "XLA_FLAGS=--xla_dump_to=/d",
      "--xla_force_host_platform_device_count=2",
    ]


def test_bad_module_is_refused():
  out = subprocess.run(
    ["bash", "launch/tpu.sh", "--dry-run", "run", "rm -rf /"],
    cwd=ROOT,
    env={**os.environ, **ENV},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert out.returncode != 0 and "not a python module" in out.stderr


_FAKE_PROCESS = """
import os, signal, sys, time
log = os.path.join(os.environ["FAKE_LOGS"], os.environ["JAX_PROCESS_ID"])
got = []
signal.signal(signal.SIGINT, lambda sig, frame: got.append(sig))
with open(log, "w") as f:
  f.write(f"{os.getpid()}\\n")
while not got:
  time.sleep(0.05)
with open(log, "a") as f:
  f.write(f"signal {got[0]}\\n")
sys.exit(75)  # stopped with a checkpoint, as the loop exits
"""


def test_ctrl_c_to_local_reaches_every_process_and_exits_75(tmp_path):
  """Ctrl-C to launch/local.sh goes to each process (each under `timeout`
  in a process group of its own, which the terminal's Ctrl-C misses); all
  exit 75 (stopped with a checkpoint), and so does the script. Processes
  are stand-ins: a Python that waits for SIGINT."""
  fake, logs = tmp_path / "python", tmp_path / "logs"
  fake.write_text(f"#!{sys.executable}\n{_FAKE_PROCESS}")
  fake.chmod(0o755)
  logs.mkdir()
  # As from a terminal: SIGINT not ignored (a pytest worker may ignore it),
  # reset by an exec'd Python (no preexec_fn: a fork of this threaded
  # process).
  default_sigint = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
  )
  script = subprocess.Popen(
    [sys.executable, "-c", default_sigint, "bash", "launch/local.sh", "2"]
    + ["experiments.grpo"],
    cwd=ROOT,
    env={
      **os.environ,
      "PYTHON": str(fake),
      "PORT": "1",
      "TIMEOUT": "60",
      "FAKE_LOGS": str(logs),
      "LOG_DIR": str(tmp_path / "out"),
    },
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  started = [logs / "0", logs / "1"]
  try:
    deadline = time.time() + 30
    while not all(p.exists() and p.read_text() for p in started):
      assert time.time() < deadline and script.poll() is None, "not started"
      time.sleep(0.05)
    script.send_signal(signal.SIGINT)
    _, err = script.communicate(timeout=30)
  finally:
    for p in started:  # never leave one running
      if p.exists() and p.read_text():
        with contextlib.suppress(ProcessLookupError):
          os.kill(int(p.read_text().split()[0]), signal.SIGKILL)
    script.kill()
  assert script.returncode == 75, err
  for p in started:
    assert p.read_text().split("\n")[1] == f"signal {int(signal.SIGINT)}"
  assert "local.sh: SIGINT to the 2 processes" in err
  assert "rerun the same command to resume" in err


def test_local_two_process_run_trains_and_writes_one_set_of_logs(tmp_path):
  """launch/local.sh: 2 processes x 2 CPU devices, jax.distributed on."""
  workdir, logs = tmp_path / "run", tmp_path / "logs"
  flags = dict(
    testing.SMOKE,
    mesh_fsdp=-1,  # every device of both processes
    workdir=workdir,
    cache_dir=tmp_path / "cache",
  )
  out = subprocess.run(
    [
      "bash",
      "launch/local.sh",
      "2",
      "experiments.grpo",
      *[f"--{k}={v}" for k, v in flags.items()],
    ],
    cwd=ROOT,
    env={**os.environ, "LOG_DIR": str(logs), "TIMEOUT": "600"},
    capture_output=True,
    text=True,
    timeout=700,
  )
  process_logs = "".join(
    f"--- {p}\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*.log"))
  )
  assert out.returncode == 0, out.stderr + process_logs
  assert sorted(p.name for p in logs.iterdir()) == [
    "process-0.log",
    "process-1.log",
  ]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  # One set of logs: every training step appears once (process 0 writes).
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  for name in ("config.json", "COMMIT", "eval_after.json", "report.md"):
    assert (workdir / name).exists(), name
