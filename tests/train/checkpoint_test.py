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
