"""Train step: sharded == single device, micro-batching, NaN guard."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.rl import aggregation
from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason import testing
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts
from rlreason.model import transformer

CFG = testing.tiny_model_config(vocab_size=64)
P_LEN, T_LEN, N = 4, 8, 8


def loss_fn(params, batch, norm, mode="seq-mean-token-mean"):
  logp = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], CFG, P_LEN
  )
  per_token = -batch["adv"][:, None] * logp
  loss = aggregation.aggregate(
    per_token, batch["mask"], mode, max_len=T_LEN, **norm
  )
  return loss, {"logp": (logp * batch["mask"]).sum() / norm["num_tokens"]}


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, T_LEN + 1, N)
  mask = (np.arange(T_LEN)[None] < lengths[:, None]).astype(np.float32)
  return {
    "tokens": jnp.asarray(rng.integers(0, 64, (N, P_LEN + T_LEN)), jnp.int32),
    "positions": jnp.broadcast_to(
      jnp.arange(P_LEN + T_LEN), (N, P_LEN + T_LEN)
    ),
    "mask": jnp.asarray(mask),
    "adv": jnp.asarray(rng.normal(size=N), jnp.float32),
  }


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0))


def _opt():
  # Small lr: Adam divides by |g|, so float noise in near-zero gradients
  # would otherwise be amplified to lr-sized parameter differences.
  return optimizer_lib.make_optimizer(1e-3, total_steps=10, grad_clip=1.0)


def _run(params, mode, micro_batches=1, mesh=None, steps=2):
  opt = _opt()
  state = ts.init_state(jax.tree.map(jnp.copy, params), opt)
  kwargs = {}
  batch = _batch()
  if mesh is not None:
    sh = ts.state_shardings(
      mesh, transformer.param_axes(CFG), transformer.param_shapes(CFG), opt
    )
    state = jax.device_put(state, sh)
    bsh = mesh_lib.batch_sharding(mesh, 1)
    batch = jax.device_put(batch, bsh)
    kwargs = dict(state_sharding=sh, batch_sharding=bsh)
  step = ts.make_train_step(
    functools.partial(loss_fn, mode=mode),
    opt,
    micro_batches=micro_batches,
    **kwargs,
  )
  out = []
  for _ in range(steps):
    state, m = step(state, batch)
    out.append(float(m["loss"]))
  return state, out


# One mode each: aggregation_test.py covers the split invariance of all.
@pytest.mark.parametrize("mode", ["seq-mean-token-mean"])
def test_sharded_step_equals_single_device(params, mode):
  single, l1 = _run(params, mode)
  sharded, l2 = _run(params, mode, mesh=mesh_lib.make_mesh(2, 2, 2))
  np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-5)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
    single.params,
    jax.device_get(sharded.params),
  )
  kernel = sharded.params["layer_0"]["mlp"]["up_kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")


@pytest.mark.parametrize("mode", ["token-mean"])
def test_micro_batches_equal_full_batch(params, mode):
  full, l1 = _run(params, mode)
  micro, l4 = _run(params, mode, micro_batches=4)
  np.testing.assert_allclose(l1, l4, rtol=1e-5, atol=1e-5)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
    full.params,
    micro.params,
  )


def test_nan_batch_is_skipped_and_training_continues(params):
  opt = _opt()
  step = ts.make_train_step(loss_fn, opt, donate=False)
  state = ts.init_state(params, opt)
  bad = dict(_batch(), adv=_batch()["adv"].at[3].set(jnp.nan))
  after_bad, m = step(state, bad)
  assert float(m["skipped"]) == 1.0
  # Exact: a skipped step selects the old params, it computes nothing.
  jax.tree.map(np.testing.assert_array_equal, after_bad.params, params)
  assert int(after_bad.step) == 1
  after_good, m = step(after_bad, _batch())
  assert float(m["skipped"]) == 0.0
  assert np.isfinite(float(m["loss"]))
  moved = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), after_good.params, params
  )
  assert max(jax.tree.leaves(moved)) > 0
  assert all(
    np.isfinite(np.asarray(x)).all()
    for x in jax.tree.leaves(after_good.opt_state)
  )


def test_a_batch_with_nothing_to_learn_is_no_update(params):
  """All masks 0 (every group filtered out): Adam's moments from the step
  before would still move the weights on zero gradients; the step leaves
  params and optimizer state exactly as they were."""
  opt = _opt()
  step = ts.make_train_step(loss_fn, opt, donate=False)
  state, m = step(ts.init_state(params, opt), _batch())
  assert float(m["empty"]) == 0.0
  empty = dict(_batch(1), mask=jnp.zeros((N, T_LEN), jnp.float32))
  after, m = step(state, empty)
  assert float(m["empty"]) == 1.0 and float(m["skipped"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, after.params, state.params)
  jax.tree.map(np.testing.assert_array_equal, after.opt_state, state.opt_state)
  assert int(after.step) == 2
  # One token to learn from, and the same state moves them.
  moved, _ = ts.make_train_step(loss_fn, opt, donate=False)(
    state, dict(empty, mask=empty["mask"].at[0, 0].set(1.0))
  )
  diff = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), moved.params, state.params
  )
  assert max(jax.tree.leaves(diff)) > 0


def test_schedule_warmup_then_cosine():
  s = optimizer_lib.make_schedule(
    1.0, total_steps=12, warmup_steps=2, schedule="cosine"
  )
  np.testing.assert_allclose(
    [s(0), s(1), s(2), s(7), s(12)],
    [0.0, 0.5, 1.0, 0.5, 0.0],
    rtol=1e-6,
    atol=1e-6,
  )
  assert float(
    optimizer_lib.make_schedule(0.1, total_steps=5)(3)
  ) == pytest.approx(0.1, rel=1e-6, abs=1e-9)
  with pytest.raises(ValueError, match="Unknown schedule 'linear'"):
    optimizer_lib.make_schedule(0.1, total_steps=5, schedule="linear")


def test_score_rows_is_a_micro_batch_rounded_up_to_the_batch_shards():
  from rlreason import config as config_lib

  cfg = dataclasses.replace(
    config_lib.BaseConfig(), batch_size=4, group_size=4, micro_batches=8
  )
  one = mesh_lib.make_mesh(1, 1, 1)
  eight = mesh_lib.make_mesh(1, 8, 1)
  assert ts.score_rows(cfg, one) == 2  # 16 rows / 8 micro-batches
  assert ts.score_rows(cfg, eight) == 8  # split over 8 shards, not 2
  assert ts.score_rows(dataclasses.replace(cfg, micro_batches=1), eight) == 16


@pytest.mark.parametrize(
  "sequences, micro_batches, shards, why, fewest",
  [
    # 16 rows, 4 micro-batches of 4 on 8 shards: 2 of 8 split.
    (16, 4, 8, "4 rows per micro-batch do not split over 8 chips", 2),
    (16, 2, 8, "", 2),  # already split: the config's own count
    (16, 16, 1, "", 16),  # one shard: anything splits
    # 960 rows in 32 micro-batches of 30: over 32 chips, 30 of 32 rows
    # (one per chip); over 4 chips, 40 of 24 (6 per chip, <= 30 rows).
    (960, 32, 32, "30 rows per micro-batch do not split over 32 chips", 30),
    (960, 32, 4, "30 rows per micro-batch do not split over 4 chips", 40),
    (12, 4, 8, "3 rows per micro-batch do not split over 8 chips", 0),
  ],
)
def test_micro_batches_that_split_over_the_batch_shards(
  sequences, micro_batches, shards, why, fewest
):
  from rlreason import config as config_lib

  cfg = dataclasses.replace(
    config_lib.BaseConfig(),
    batch_size=sequences // 4,
    group_size=4,
    micro_batches=micro_batches,
  )
  assert cfg.num_sequences == sequences and cfg.minibatches == 1
  assert ts.unsplit(cfg, shards) == why
  assert ts.splitting_micro_batches(cfg, shards) == fewest
  if fewest:
    fixed = dataclasses.replace(cfg, micro_batches=fewest)
    assert ts.unsplit(fixed, shards) == ""


@pytest.mark.parametrize("data,tensor", [(1, 1), (2, 1), (1, 2), (2, 4)])
def test_batch_shards_is_the_meshs_batch_divisor(data, tensor):
  from rlreason import config as config_lib

  cfg = dataclasses.replace(
    config_lib.BaseConfig(), mesh_data=data, mesh_tensor=tensor
  )
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  assert ts.batch_shards(cfg, 8) == mesh_lib.batch_divisor(mesh) == 8 // tensor


def test_the_temporaries_budget_is_a_tpu_only_compile_option():
  """--train_temp_budget_mib reaches libtpu (tests/plan/plan_test.py); on
  other backends the step compiles as without it, and a bad value is
  refused before any compute."""
  from rlreason import config as config_lib

  mesh = mesh_lib.make_mesh(1, 1, 1)
  assert ts.compiler_options(64, mesh) is None  # CPU
  assert ts.compiler_options(0, mesh) is None
  for name in ("train_temp_budget_mib", "rollout_temp_budget_mib"):
    with pytest.raises(ValueError, match=f"--{name}=-1"):
      config_lib.BaseConfig(**{name: -1}).validate()


def test_run_updates_passes_over_the_batch_in_shuffled_minibatches():
  """2 epochs x 2 minibatches of 6 rows: four calls of 3 rows, each epoch
  every row once, in the generator's order; the state threads through
  the calls, the metrics come back on the host, progress after each
  call but the last. One minibatch keeps the rows in order."""
  batch = {"mask": np.ones((6, 2), np.float32), "row": np.arange(6)}
  seen, done = [], []

  def step_fn(state, mb):
    seen.append(np.asarray(mb["row"]).tolist())
    return state + 1, {"rows": jnp.asarray(mb["row"]).sum()}

  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state, metrics = ts.run_updates(
    step_fn,
    0,
    batch,
    one,
    epochs=2,
    minibatches=2,
    rng=np.random.default_rng(7),
    progress=done.append,
  )
  rng = np.random.default_rng(7)
  want = [p.tolist() for _ in range(2) for p in np.split(rng.permutation(6), 2)]
  assert seen == want and state == 4 and done == [1, 2, 3]
  assert (
    sorted(seen[0] + seen[1]) == sorted(seen[2] + seen[3]) == list(range(6))
  )
  assert [type(m["rows"]) for m in metrics] == [np.ndarray] * 4
  assert [int(m["rows"]) for m in metrics] == [sum(p) for p in want]
  seen.clear()
  ts.run_updates(step_fn, 0, batch, one, epochs=1, minibatches=1, rng=None)
  assert seen == [list(range(6))]


def test_run_updates_leaves_out_the_rows_past_whole_minibatches():
  """rows=2 of 7 in 3 minibatches: three calls of 2 rows from the order's
  first 6, the 7th row left out of the epoch."""
  batch = {"mask": np.ones((7, 2), np.float32), "row": np.arange(7)}
  seen = []

  def step_fn(state, mb):
    seen.append(np.asarray(mb["row"]).tolist())
    return state, {}

  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  ts.run_updates(
    step_fn,
    0,
    batch,
    one,
    epochs=1,
    minibatches=3,
    rows=2,
    rng=np.random.default_rng(3),
  )
  order = np.random.default_rng(3).permutation(7)
  assert seen == [p.tolist() for p in np.split(order[:6], 3)]


@pytest.mark.parametrize(
  "n, minibatches, micro_batches, own, shards, want",
  [
    # ORZ: 8192 rows, micro-batches of 16; 12 critic updates of 42 of them
    # (8192 // 12 = 682 -> 672 rows), 128 rows left out.
    (8192, 1, 512, 12, 16, (672, 42)),
    (128, 2, 1, 2, 4, (64, 1)),  # the policy's own minibatch
    (128, 2, 1, 12, 4, (8, 1)),  # 10 rows < a micro-batch: 2 shards of 4
    (128, 2, 1, 200, 1, (0, 1)),  # not a row per update
    # Micro-batches of 6 rows over 4 shards: whole pairs of them (12 rows).
    (96, 1, 16, 2, 4, (48, 8)),
    (96, 1, 16, 5, 4, (12, 2)),  # 19 rows -> 12
  ],
)
def test_group_minibatch(n, minibatches, micro_batches, own, shards, want):
  cfg = types.SimpleNamespace(
    num_sequences=n, minibatches=minibatches, micro_batches=micro_batches
  )
  assert ts.group_minibatch(cfg, own, shards) == want
