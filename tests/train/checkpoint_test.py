"""Checkpointer: round trip, keep-last-N, sharded restore, NaN refusal."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.train import checkpoint
from rlreason import mesh as mesh_lib
from rlreason import metrics


def _state(scale=1.0):
  return {
    "w": jnp.arange(16.0).reshape(8, 2) * scale,
    "step": jnp.array(3, jnp.int32),
  }


def test_round_trip_keep_last_and_meta(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), keep=2)
  assert ckpt.restore(checkpoint.abstract(_state())) == (None, None)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {"data": [0, step], "seed": 7})
  assert ckpt.latest_step() == 3
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["2", "3"]
  state, meta = ckpt.restore(checkpoint.abstract(_state()))
  np.testing.assert_array_equal(state["w"], _state(3)["w"])
  assert meta == {"data": [0, 3], "seed": 7}
  ckpt.close()


def test_background_saves_survive_donation_and_wait(tmp_path):
  """A background save returns with the state on the host: the train step
  may donate it at once; latest_step, restore and close wait for the
  write."""
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, background=True)
  bump = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
  state = {"w": jnp.arange(1 << 16, dtype=jnp.float32)}
  for step in (1, 2, 3):
    ckpt.save(step, state, {"step": step})
    state = bump(state)  # donates what was just saved
  assert ckpt.latest_step() == 3
  restored, meta = ckpt.restore(checkpoint.abstract(state))
  np.testing.assert_array_equal(restored["w"], np.arange(1 << 16) + 2.0)
  assert meta == {"step": 3}
  ckpt.save(4, state, {"step": 4})
  ckpt.close()
  assert sorted(os.listdir(tmp_path)) == ["3", "4"]


_FAILS_AFTER_A_SAVE = """
import sys
import jax.numpy as jnp
from rlreason.train import checkpoint

with checkpoint.Checkpointer(sys.argv[1], background=True) as ckpt:
  ckpt.save(1, {"w": jnp.ones((64, 64))}, {"step": 1})
  raise RuntimeError("boom")
"""


def test_an_error_after_a_background_save_still_finishes_its_write(tmp_path):
  """A process whose run fails while a write is in flight: as a context
  manager the Checkpointer finishes it (the process exits at once after
  the error otherwise, leaving orbax's temporary directory, no checkpoint)
  and the error is the one reported."""
  import subprocess
  import sys

  directory = str(tmp_path / "ckpt")
  out = subprocess.run(
    [sys.executable, "-c", _FAILS_AFTER_A_SAVE, directory],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 1
  assert "RuntimeError: boom" in out.stderr
  assert "finishing checkpoint 1's write before stopping" in out.stderr
  assert os.listdir(directory) == ["1"]
  assert checkpoint.Checkpointer(directory).latest_step() == 1


def test_restore_into_a_sharding(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  ckpt.save(5, _state(), {})
  mesh = mesh_lib.make_mesh(2, 2, 2)
  target = jax.device_put(
    _state(0.0),
    {"w": mesh_lib.batch_sharding(mesh, 2), "step": mesh_lib.replicated(mesh)},
  )
  state, _ = ckpt.restore(checkpoint.abstract(target))
  assert state["w"].sharding == target["w"].sharding
  np.testing.assert_array_equal(state["w"], _state()["w"])


def test_refuses_non_finite_state(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  with pytest.raises(ValueError, match="non-finite"):
    ckpt.save(1, {"w": jnp.array([1.0, jnp.nan])}, {})
  assert ckpt.latest_step() is None


def test_metric_writer_jsonl_and_tensorboard(tmp_path):
  w = metrics.MetricWriter(str(tmp_path), tensorboard=True)
  w.write(1, {"reward": np.array([0.0, 1.0]), "loss": 2.0})
  w.write(2, {"reward": 1.0, "loss": float("nan")})
  w.close()
  rows = metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2]
  assert rows[0]["reward"] == 0.5 and rows[1]["loss"] == "nan"
  assert os.listdir(tmp_path / "tensorboard")
  off = metrics.MetricWriter(str(tmp_path / "other"), enabled=False)
  off.write(1, {"x": 1.0})
  assert not os.path.exists(tmp_path / "other")


def _tensorboard_restarts(directory) -> list[int]:
  """The steps of the SessionLog START events in a TensorBoard directory's
  event files (TFRecords of Event protos): where TensorBoard hides the
  earlier events from."""
  import struct

  from tensorboardX.proto import event_pb2

  starts = []
  for name in os.listdir(directory):
    data = open(os.path.join(directory, name), "rb").read()
    i = 0
    while i < len(data):  # length, its CRC, the record, its CRC
      (n,) = struct.unpack("<Q", data[i : i + 8])
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
      if event.session_log.status == event_pb2.SessionLog.START:
        starts.append(event.step)
      i += 12 + n + 4
  return starts


def test_a_resumed_writer_hides_the_redone_steps_and_keeps_its_wandb_run(
  tmp_path, monkeypatch
):
  """keep_through=3 (resumed at 3): TensorBoard hides events from step 4
  on, and wandb continues the workdir's run (the id in wandb_run_id); a
  fresh run (-1) hides all earlier events and starts another wandb run.
  wandb is a stand-in recording init's arguments."""
  import sys
  import types

  inits = []
  fake = types.SimpleNamespace(
    init=lambda **kw: (
      inits.append(kw)
      or types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)
    )
  )
  monkeypatch.setitem(sys.modules, "wandb", fake)
  for run, keep in (("a", -1), ("a", 3), ("a", -1), ("b", 0)):
    w = metrics.MetricWriter(
      str(tmp_path / run), keep_through=keep, wandb_project="p"
    )
    w.write(keep + 1, {"loss": 1.0})
    w.close()
  ids = [kw["id"] for kw in inits]
  assert ids[0] == ids[1] != ids[2] and ids[3] not in ids[:3]
  assert all(kw["resume"] == "allow" for kw in inits)
  assert (tmp_path / "a/wandb_run_id").read_text().strip() == ids[2]
  # One writer per directory (event files are named by the second).
  for keep in (3, -1):
    d = tmp_path / f"tb{keep}"
    metrics.MetricWriter(str(d), keep_through=keep).close()
    assert _tensorboard_restarts(d / "tensorboard") == [keep + 1]


def _three_checkpoints(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), keep=3)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {"step": step})
  ckpt.close()
  return tmp_path / "ckpt"


def _truncate_an_array_file(step_dir):
  files = [
    os.path.join(d, f)
    for d, _, fs in os.walk(step_dir / "state")
    for f in fs
    if "/d/" in os.path.join(d, f)  # TensorStore's data chunks
  ]
  assert files, "no array data files found"
  for f in files:
    with open(f, "r+b") as fh:
      fh.truncate(3)


@pytest.mark.parametrize(
  "corrupt",
  [
    _truncate_an_array_file,
    lambda d: open(d / "state" / "_METADATA", "w").write('{"tree_me'),
    lambda d: open(d / "meta" / "metadata", "w").write('{"step": '),
  ],
  ids=["truncated_array", "truncated_METADATA", "truncated_meta"],
)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous(
  tmp_path, corrupt, caplog
):
  directory = _three_checkpoints(tmp_path)
  corrupt(directory / "3")
  ckpt = checkpoint.Checkpointer(str(directory), keep=3)
  state, meta = ckpt.restore(checkpoint.abstract(_state()))
  np.testing.assert_array_equal(state["w"], _state(2)["w"])
  assert meta == {"step": 2}
  # Moved aside, never deleted.
  assert sorted(os.listdir(directory)) == ["1", "2"]
  (aside,) = os.listdir(str(directory) + ".corrupt")
  assert aside.startswith("3-")
  assert "Checkpoint 3" in caplog.text and "checkpoint 2" in caplog.text
  # The next save goes on from the restored step.
  ckpt.save(3, _state(30), {"step": 3})
  assert ckpt.latest_step() == 3
  ckpt.close()


def test_no_restorable_checkpoint_starts_over(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=1)
  ckpt.save(1, _state(), {})
  ckpt.close()
  _truncate_an_array_file(tmp_path / "c" / "1")
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=1)
  assert ckpt.restore(checkpoint.abstract(_state())) == (None, None)
  assert os.listdir(str(tmp_path / "c") + ".corrupt")


def test_keep_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match="keep=0"):
    checkpoint.Checkpointer(str(tmp_path), keep=0)


_FULL_DISK = r"""
import resource, signal, sys
import jax
import jax.numpy as jnp
from rlreason.train import checkpoint

background = sys.argv[2] == "background"
ckpt = checkpoint.Checkpointer(sys.argv[1], keep=2, background=background)
ckpt.save(1, {"w": jnp.ones(8)}, {"step": 1})
ckpt.wait()
# A full disk: writes past 64 KiB fail with EFBIG (SIGXFSZ ignored).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
try:
  w = jax.random.normal(jax.random.key(0), (1 << 18,))  # incompressible
  ckpt.save(2, {"w": w}, {"step": 2})
  print("save returned")
  ckpt.save(3, {"w": w}, {"step": 3})  # in the background: 2's error here
except checkpoint.CheckpointError as e:
  print("ERROR:", e)
  sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["blocking", "background"])
def test_a_failed_save_names_the_path_and_keeps_the_previous(tmp_path, mode):
  """A background write's failure is raised by the next save, naming the
  step that failed."""
  import subprocess
  import sys

  directory = str(tmp_path / "ckpt")
  proc = subprocess.run(
    [sys.executable, "-c", _FULL_DISK, directory, mode],
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""},
  )
  assert proc.returncode == 3, proc.stderr[-2000:]
  assert ("save returned" in proc.stdout) == (mode == "background")
  assert f"Could not write checkpoint 2 to {directory}" in proc.stdout
  assert "File too large" in proc.stdout
  # One message, not orbax's threads' tracebacks.
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  ckpt = checkpoint.Checkpointer(directory, keep=2)
  assert ckpt.latest_step() == 1
  state, meta = ckpt.restore(checkpoint.abstract({"w": jnp.zeros(8)}))
  np.testing.assert_array_equal(state["w"], np.ones(8))
  assert meta == {"step": 1}
  # The failed write's leftovers (orbax's temporary directory, as a process
  # killed mid-write leaves it) do not stand in the way of the next save.
  ckpt.save(2, {"w": jnp.full(8, 2.0)}, {"step": 2})
  assert ckpt.latest_step() == 2
  state, _ = ckpt.restore(checkpoint.abstract({"w": jnp.zeros(8)}))
  np.testing.assert_array_equal(state["w"], np.full(8, 2.0))
