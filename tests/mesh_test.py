"""Mesh creation, rule tables, and sharded == single-device forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason import testing
from rlreason.model import transformer
from rlreason.train import run_info

CFG = testing.tiny_model_config(vocab_size=64, qkv_bias=True)


def test_make_mesh_fills_minus_one():
  assert jax.device_count() == 8
  assert dict(mesh_lib.make_mesh(2, -1, 2).shape) == {
    "data": 2,
    "fsdp": 2,
    "tensor": 2,
  }
  assert dict(mesh_lib.make_mesh(1, 1, -1).shape)["tensor"] == 8
  # All sizes explicit and fewer than the devices: the first devices.
  assert mesh_lib.make_mesh(1, 2, 1).devices.size == 2


@pytest.mark.parametrize(
  "sizes,msg",
  [
    ((3, -1, 1), "cannot be split"),
    ((2, 2, 4), "needs 16 devices"),
    ((-1, -1, 1), "At most one"),
    ((0, 1, 1), "positive"),
  ],
)
def test_make_mesh_errors(sizes, msg):
  with pytest.raises(ValueError, match=msg):
    mesh_lib.make_mesh(*sizes)


def test_spec_replicates_indivisible_dims_and_never_reuses_an_axis():
  mesh = mesh_lib.make_mesh(1, 2, 4)
  rules = mesh_lib.TRAIN_RULES
  # 2 kv heads cannot split over tensor=4: replicated instead of failing.
  assert mesh_lib.spec(
    ("embed", "kv_heads", "head_dim"), rules, (32, 2, 8), mesh
  ) == P("fsdp", None, None)
  assert mesh_lib.spec(("batch", None), rules) == P(("data", "fsdp"), None)
  assert mesh_lib.spec(("embed", "embed"), rules) == P("fsdp", None)
  with pytest.raises(ValueError, match="'bogus' has no rule"):
    mesh_lib.spec(("bogus",), rules)


@pytest.mark.parametrize("rules", ["TRAIN_RULES", "ROLLOUT_RULES"])
def test_sharded_forward_equals_single_device(rules):
  rules = getattr(mesh_lib, rules)
  params = transformer.init(CFG, jax.random.key(0))
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(0, 64, (8, 12)), jnp.int32
  )
  single = policy.logits(params, tokens, CFG)

  mesh = mesh_lib.make_mesh(2, 2, 2)
  shardings = mesh_lib.shardings(
    mesh, transformer.param_axes(CFG), rules, transformer.param_shapes(CFG)
  )
  sharded_params = jax.device_put(params, shardings)
  sharded_tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh, 2))
  kernel = sharded_params["layer_0"]["mlp"]["gate_kernel"]
  assert len({s.device for s in kernel.addressable_shards}) == 8
  want = (
    P("fsdp", "tensor") if rules is mesh_lib.TRAIN_RULES else P(None, "tensor")
  )
  assert kernel.sharding.spec == want
  out = policy.logits(sharded_params, sharded_tokens, CFG)
  np.testing.assert_allclose(out, single, rtol=1e-5, atol=1e-5)


def test_a_layers_weights_wait_for_its_input_on_a_mesh():
  # blocks.gathered_at: each weight a layer multiplies by (q, k, v, o,
  # gate, up, down) passes an optimization barrier with the layer's input,
  # so FSDP's gather of it cannot be hoisted ahead of the layer (a 32B
  # train step for v5p-256 held all 64 layers' gathered weights at once).
  # Not without a mesh, and not for a decode step (one token per row).
  params = transformer.init(CFG, jax.random.key(0))
  mesh = mesh_lib.make_mesh(1, -1, 1)

  def barriers(q_len, act_mesh):
    tokens = jnp.zeros((8, q_len), jnp.int32)
    hlo = policy._logits.lower(  # noqa: SLF001 - the jitted forward
      params, tokens, CFG, None, act_mesh
    ).as_text()
    return hlo.count("optimization_barrier")

  assert barriers(12, mesh) == 7 * CFG.n_layers
  assert barriers(12, None) == 0
  assert barriers(1, mesh) == 0


def test_rollout_rules_replicate_only_what_fits():
  mesh = mesh_lib.make_mesh(1, 4, 2)
  gib = 1 << 30
  # 10 GiB of weights over tensor=2: 5 GiB per device.
  assert mesh_lib.rollout_rules(mesh, 10 * gib, 16 * gib) is (
    mesh_lib.ROLLOUT_RULES
  )  # 5 <= 0.4 * 16
  assert mesh_lib.rollout_rules(mesh, 20 * gib, 16 * gib) is (
    mesh_lib.ROLLOUT_FSDP_RULES
  )  # 10 > 6.4: split over fsdp as in training
  assert mesh_lib.ROLLOUT_FSDP_RULES["embed"] == "fsdp"
  # CPUs report no memory limit: replicated.
  assert mesh_lib.rollout_rules(mesh, 10**15) is mesh_lib.ROLLOUT_RULES
  # --rollout_layout chooses whatever the memory.
  assert mesh_lib.rollout_rules(mesh, 10 * gib, 16 * gib, "fsdp") is (
    mesh_lib.ROLLOUT_FSDP_RULES
  )
  assert mesh_lib.rollout_rules(mesh, 20 * gib, 16 * gib, "replicated") is (
    mesh_lib.ROLLOUT_RULES
  )
  with pytest.raises(ValueError, match="rollout layout 'tp'"):
    mesh_lib.rollout_rules(mesh, gib, 16 * gib, "tp")
  assert config.ROLLOUT_LAYOUTS == mesh_lib.ROLLOUT_LAYOUTS  # the flag's


def test_sequence_parallel_needs_a_tensor_axis():
  """--sequence_parallel splits tokens over tensor: refused before any
  compute without a tensor split to split them over."""
  with pytest.raises(config.ConfigError, match="--sequence_parallel"):
    config.BaseConfig(sequence_parallel=True).validate()
  config.BaseConfig(sequence_parallel=True, mesh_tensor=2).validate()
  config.BaseConfig(sequence_parallel=True, rollout_tensor=4).validate()
  # Layout and compilation only (the same numbers): a resumed run may
  # change them; each reaches the model's config.
  assert {"sequence_parallel", "scan_layers"} <= set(run_info.RESUMABLE_CHANGES)
  settings = config.BaseConfig(sequence_parallel=True, remat=True)
  assert settings.model_settings() == {
    "remat": True, "remat_policy": "full", "sequence_parallel": True,
    "scan_layers": False,
  }  # fmt: skip
  scanned = config.BaseConfig(scan_layers=True).model_settings()
  assert scanned["scan_layers"] is True


def test_rollout_mesh_regroups_the_same_devices_in_their_order():
  """--rollout_tensor: the run's devices, in its order (one device
  assignment: programs mixing both meshes compile), as (data, rest, T);
  T = 0 or the mesh's own size is the mesh itself; T must divide each
  data replica's devices."""
  mesh = mesh_lib.make_mesh(2, 4, 1)
  for tensor, fsdp in ((2, 2), (4, 1)):
    got = mesh_lib.rollout_mesh(mesh, tensor)
    assert dict(got.shape) == {"data": 2, "fsdp": fsdp, "tensor": tensor}
    assert list(got.devices.flat) == list(mesh.devices.flat)
    # Each data replica keeps its devices (no group straddles two).
    np.testing.assert_array_equal(
      got.devices.reshape(2, -1), mesh.devices.reshape(2, -1)
    )
  assert mesh_lib.rollout_mesh(mesh, 0) is mesh
  assert mesh_lib.rollout_mesh(mesh, 1) is mesh
  back = mesh_lib.rollout_mesh(mesh_lib.rollout_mesh(mesh, 2), 1)
  assert dict(back.shape) == dict(mesh.shape)
  for bad in (3, 8, -2):
    with pytest.raises(ValueError, match=f"--rollout_tensor={bad} must"):
      mesh_lib.rollout_mesh(mesh, bad)
  with pytest.raises(config.ConfigError, match="--rollout_tensor=-1"):
    config.BaseConfig(rollout_tensor=-1).validate()
