"""LoRA adapters and the quantised base on hand values and invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import testing
from rlreason.model import hf_layout
from rlreason.model import lora
from rlreason.model import transformer

CFG = testing.tiny_model_config(qkv_bias=True)


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0))


def _inputs():
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(3, CFG.vocab_size, (2, 7)), jnp.int32
  )
  return tokens, jnp.broadcast_to(jnp.arange(7), (2, 7))


def _logits(params):
  return transformer.apply(params, *_inputs(), CFG)[0]


@pytest.mark.parametrize("targets", ["attention", "mlp", "all"])
def test_zero_b_is_the_base_exactly(params, targets):
  lcfg = lora.LoraConfig(rank=4, targets=targets)
  adapters = lora.init(params, lcfg, jax.random.key(1))
  kernels = {n for sub in adapters.values() for g in sub.values() for n in g}
  assert kernels == set(lora.TARGETS[targets])
  np.testing.assert_array_equal(
    _logits(lora.combine(params, adapters, lcfg)), _logits(params)
  )


def test_effective_weight_by_hand():
  """W + (alpha / r) A B on a 2 x 3 kernel, r = 1."""
  w = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  a = jnp.asarray([[1.0], [2.0]])
  b = jnp.asarray([[0.5, 0.0, -1.0]])
  lcfg = lora.LoraConfig(rank=1, alpha=2.0)
  leaf = {"base": w, "a": a, "b": b * lcfg.scale}
  np.testing.assert_allclose(
    lora.effective(leaf),
    [[2.0, 2.0, 1.0], [6.0, 5.0, 2.0]],
    rtol=0,
    atol=1e-6,
  )


def test_merged_equals_combined_and_adapters_change_the_output(params):
  lcfg = lora.LoraConfig(rank=4)
  adapters = jax.tree.map(
    lambda x: x + 0.02, lora.init(params, lcfg, jax.random.key(1))
  )
  combined = _logits(lora.combine(params, adapters, lcfg))
  merged = _logits(lora.merge(params, adapters, lcfg))
  np.testing.assert_allclose(merged, combined, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(combined - _logits(params)).max()) > 1e-2


def test_scanned_layers_read_adapted_kernels_as_the_unrolled_stack(params):
  """ModelConfig.scan_layers with LoRA-adapted and quantised kernels on
  every layer (stacked whole), and with adapters on one layer only (the
  layers differ: unrolled), gives the unrolled stack's logits."""
  import dataclasses  # noqa: PLC0415

  scanned = dataclasses.replace(CFG, scan_layers=True)
  lcfg = lora.LoraConfig(rank=4, quantize="int8")
  adapters = jax.tree.map(
    lambda x: x + 0.02, lora.init(params, lcfg, jax.random.key(1))
  )
  base = lora.quantize(params, lcfg)
  one_layer = {"layer_0": adapters["layer_0"]}
  for tree, scans in [
    (lora.combine(base, adapters, lcfg), 1),
    (lora.combine(params, one_layer, lcfg), 0),
  ]:
    eqns = testing.jaxpr_eqns(
      lambda p: transformer.apply(p, *_inputs(), scanned)[0], tree
    )
    assert sum(e.primitive.name == "scan" for e in eqns) == scans
    np.testing.assert_allclose(
      transformer.apply(tree, *_inputs(), scanned)[0],
      _logits(tree),
      rtol=1e-5,
      atol=1e-5,
    )


def test_int8_rounds_each_channel_to_its_absmax_grid():
  w = jnp.asarray([[0.5, -2.0], [-1.0, 1.0], [0.25, 0.5]])  # [in 3, out 2]
  q = lora._int8(w, 1)
  np.testing.assert_array_equal(q["absmax"], [[1.0, 2.0]])
  np.testing.assert_array_equal(q["int8"][:, 0], [64, -127, 32])  # 63.5 -> 64
  back = np.asarray(lora.dequantize(q))
  # Half a grid step per channel: absmax / 127 / 2.
  assert (np.abs(back - np.asarray(w)) <= np.asarray([1.0, 2.0]) / 254).all()


def test_nf4_picks_the_nearest_code_and_packs_two_per_byte():
  # One block of 4 along the last axis (gcd(4, 64)): absmax 2.
  w = jnp.asarray([[2.0, -2.0, 0.0, 0.33]])
  q = lora._nf4(w, 1)
  assert q["codes"].dtype == jnp.uint8 and q["codes"].shape == (1, 2)
  np.testing.assert_array_equal(q["absmax"], [[2.0]])
  # 0.33 / 2 = 0.165: nearest code 0.1609 (index 9).
  np.testing.assert_allclose(
    lora.dequantize(q), [[2.0, -2.0, 0.0, 2 * 0.16093020141124725]],
    rtol=1e-6, atol=1e-6,
  )  # fmt: skip
  assert int(q["codes"][0, 0]) == 15 | (0 << 4)  # codes 15 and 0


@pytest.mark.parametrize("kind, tol", [("int8", 0.01), ("nf4", 0.15)])
def test_quantised_base_keeps_the_model_close(params, kind, tol):
  lcfg = lora.LoraConfig(rank=4, quantize=kind)
  base = lora.quantize(params, lcfg)
  q = base["layer_0"]["mlp"]["up_kernel"]
  assert all(x.dtype in (jnp.int8, jnp.uint8, jnp.float32) for x in q.values())
  ref = _logits(params)
  err = float(jnp.abs(_logits(base) - ref).max() / jnp.abs(ref).max())
  assert err < tol, err
  # The adapted model over a quantised base starts as that base.
  adapters = lora.init(params, lcfg, jax.random.key(1))
  np.testing.assert_array_equal(
    _logits(lora.combine(base, adapters, lcfg)), _logits(base)
  )


def test_peft_tensors_have_peft_shapes(params):
  lcfg = lora.LoraConfig(rank=3, alpha=6.0, targets="all")
  adapters = lora.init(params, lcfg, jax.random.key(1))
  config, tensors = hf_layout.peft_files(adapters, CFG, lcfg, "base")
  assert config["r"] == 3 and config["lora_alpha"] == 6.0
  assert "q_proj" in config["target_modules"]
  key = "base_model.model.model.layers.0.self_attn.o_proj"
  h, dh, d = CFG.n_heads, CFG.head_dim, CFG.d_model
  assert tensors[f"{key}.lora_A.weight"].shape == (3, h * dh)
  assert tensors[f"{key}.lora_B.weight"].shape == (d, 3)
  assert len(tensors) == 2 * 7 * CFG.n_layers


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(rank=0), "rank=0"),
    (dict(rank=2, targets="ffn"), "targets='ffn'"),
    (dict(rank=2, quantize="fp8"), "quantize='fp8'"),
  ],
)
def test_bad_config(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lora.LoraConfig(**kwargs)
