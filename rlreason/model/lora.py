"""LoRA adapters and a quantised frozen base (QLoRA), on plain param pytrees.

  lcfg = lora.LoraConfig(rank=16, alpha=32, targets="all", quantize="nf4")
  base = lora.quantize(params, lcfg)                 # frozen, int8 / nf4
  adapters = lora.init(params, lcfg, rng)            # what the optimizer sees
  logits, _ = transformer.apply(lora.combine(base, adapters, lcfg), ...)
  merged = lora.merge(base, adapters, lcfg)          # plain params (rollouts)
  hf_layout.peft_files(adapters, model_cfg, lcfg)    # PEFT format

LoRA (Hu et al. 2021): a target weight W [in..., out...] is used as
W + (alpha / r) A B, A [in..., r] and B [r, out...], with B = 0 at init so
the adapted model starts as the base. `combine` puts {"base", "a", "b"}
dicts at the targets' leaves (a pure tree join, nothing is computed); the
model (blocks.param -> `effective`) forms each effective weight at
use, one layer at a time, dequantising a quantised base on the way. So the
train step differentiates the adapters alone, the base is never copied,
and the reference policy for KL is the base itself (`combine` without
adapters). `merge` forms every effective weight once (the rollout's copy).

Why not Google's qwix (Tunix's LoRA): its linen path rewrites a module's
einsums by interception and adds the adapter leaves inside the module's
own param tree. Our forward is one pure function of a params pytree shared
by trainer, sampler, scorer and planner; a tree transform keeps that
function and keeps trainable and frozen leaves in separate trees without
any model surgery.

Quantisation of the frozen base (the layers' kernels; embeddings and norms
stay in the compute dtype): "int8", absmax per output channel; "nf4",
QLoRA's 4-bit NormalFloat code book with an absmax per block of 64 values
along the last axis, two codes per byte.
"""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TARGETS = {
  "attention": ("q_kernel", "k_kernel", "v_kernel", "o_kernel"),
  "mlp": ("gate_kernel", "up_kernel", "down_kernel"),
}
TARGETS["all"] = TARGETS["attention"] + TARGETS["mlp"]
QUANTIZE = ("", "int8", "nf4")
# Input (contracted) dims of each kernel: the rest are its outputs.
_IN_DIMS = {
  "q_kernel": 1,
  "k_kernel": 1,
  "v_kernel": 1,
  "o_kernel": 2,
  "gate_kernel": 1,
  "up_kernel": 1,
  "down_kernel": 1,
}
# The HF module names (PEFT's target_modules) of each kernel.
HF_MODULES = {
  "q_kernel": "q_proj",
  "k_kernel": "k_proj",
  "v_kernel": "v_proj",
  "o_kernel": "o_proj",
  "gate_kernel": "gate_proj",
  "up_kernel": "up_proj",
  "down_kernel": "down_proj",
}
# QLoRA's NF4 code book (Dettmers et al. 2023, appendix E).
NF4 = np.asarray(
  [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
  ],
  np.float32,
)  # fmt: skip
NF4_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank r (> 0), alpha (the update is scaled by alpha / r), which
  kernels ("attention", "mlp", "all") and how the base is held."""

  rank: int
  alpha: float = 32.0
  targets: str = "all"
  quantize: str = ""

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank={self.rank} must be >= 1")
    if self.targets not in TARGETS:
      raise ValueError(
        f"LoRA targets={self.targets!r}; expected one of {sorted(TARGETS)}"
      )
    if self.quantize not in QUANTIZE:
      raise ValueError(
        f"LoRA quantize={self.quantize!r}; expected one of {QUANTIZE}"
      )

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _targets(params, names):
  """(layer, group, kernel) of every target leaf in a params tree."""
  return [
    (layer, group, name)
    for layer, sub in params.items()
    if layer.startswith("layer_")
    for group, leaves in sub.items()
    for name in leaves
    if name in names
  ]


def _split(shape, name):
  n_in = _IN_DIMS[name]
  return tuple(shape[:n_in]), tuple(shape[n_in:])


def init(params_or_shapes, lcfg: LoraConfig, rng: jax.Array) -> dict:
  """Adapters {layer: {group: {kernel: {"a", "b"}}}} in fp32: A ~ N(0,
  1 / fan_in) (so x A keeps x's scale), B = 0."""
  out = {}
  targets = _targets(params_or_shapes, TARGETS[lcfg.targets])
  for i, (layer, group, name) in enumerate(targets):
    shape = params_or_shapes[layer][group][name].shape
    ins, outs = _split(shape, name)
    fan_in = math.prod(ins)
    a = jax.random.normal(
      jax.random.fold_in(rng, i), ins + (lcfg.rank,), jnp.float32
    ) / math.sqrt(fan_in)
    b = jnp.zeros((lcfg.rank,) + outs, jnp.float32)
    out.setdefault(layer, {}).setdefault(group, {})[name] = {"a": a, "b": b}
  return out


def axes(param_axes: dict, adapters: dict) -> dict:
  """Logical axes of the adapters from the kernels' (rank unsharded)."""
  out = {}
  for layer, sub in adapters.items():
    for group, leaves in sub.items():
      for name in leaves:
        ins, outs = _split(param_axes[layer][group][name], name)
        out.setdefault(layer, {}).setdefault(group, {})[name] = {
          "a": ins + (None,),
          "b": (None,) + outs,
        }
  return out


def combine(base: dict, adapters: dict | None, lcfg: LoraConfig) -> dict:
  """The params tree the model reads: each adapted kernel becomes
  {"base", "a", "b"} with B pre-scaled by alpha / r (a tree join)."""
  if not adapters:
    return base
  scale = lambda b: b * lcfg.scale if lcfg.scale != 1 else b  # noqa: E731
  return _replaced(
    base,
    {
      (layer, group, name): {
        "base": base[layer][group][name],
        "a": adapters[layer][group][name]["a"],
        "b": scale(adapters[layer][group][name]["b"]),
      }
      for layer, group, name in _targets(adapters, TARGETS["all"])
    },
  )


def _replaced(tree: dict, leaves: dict) -> dict:
  """`tree` with the leaves at {(layer, group, name): value} replaced; the
  untouched parts are shared, not copied."""
  out = dict(tree)
  for (layer, group, name), value in leaves.items():
    if out[layer] is tree[layer]:
      out[layer] = {g: dict(v) for g, v in tree[layer].items()}
    out[layer][group][name] = value
  return out


def _quantized(leaf) -> bool:
  return isinstance(leaf, dict) and ("codes" in leaf or "int8" in leaf)


def formed(leaf) -> bool:
  """Whether a params leaf is a kernel formed at use (effective): a
  quantised base, or a base with its LoRA adapters."""
  return _quantized(leaf) or (isinstance(leaf, dict) and "base" in leaf)


def effective(leaf: Any, dtype=None) -> jax.Array:
  """The weight a params leaf stands for: itself, a quantised base
  dequantised, or base + A B (blocks.param calls this)."""
  if not isinstance(leaf, dict):
    return leaf
  if _quantized(leaf):
    return dequantize(leaf, dtype or jnp.float32)
  w = effective(leaf["base"], dtype)
  dt = dtype or w.dtype
  a, b = leaf["a"], leaf["b"]
  r = a.shape[-1]
  delta = jnp.dot(
    a.reshape(-1, r).astype(dt),
    b.reshape(r, -1).astype(dt),
    preferred_element_type=jnp.float32,
  )
  return (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(dt)


def merge(base: dict, adapters: dict | None, lcfg: LoraConfig, dtype=None):
  """Plain params: every adapted or quantised kernel formed once."""
  return formed_once(combine(base, adapters, lcfg), dtype)


def formed_once(tree: dict, dtype=None) -> dict:
  """Plain params from a tree whose kernels may be formed at use
  (`formed`: a quantised base, base + adapters), each formed once."""
  return jax.tree.map(
    lambda x: effective(x, dtype) if formed(x) else x, tree, is_leaf=formed
  )


def quantize(params: dict, lcfg: LoraConfig) -> dict:
  """The layers' kernels of `params` held as lcfg.quantize (no-op for "")."""
  if not lcfg.quantize:
    return params
  # One compiled program per kernel shape: eager ops would compile each op
  # on first use and hold nf4's [..., 16] code distances in memory.
  fn = jax.jit({"int8": _int8, "nf4": _nf4}[lcfg.quantize], static_argnums=1)
  return _replaced(
    params,
    {
      (layer, group, name): fn(params[layer][group][name], _IN_DIMS[name])
      for layer, group, name in _targets(params, TARGETS["all"])
    },
  )


def _int8(w, n_in):
  """Symmetric int8 with one fp32 absmax per output channel."""
  w = jnp.asarray(w, jnp.float32)
  absmax = jnp.max(jnp.abs(w), axis=tuple(range(n_in)), keepdims=True)
  absmax = jnp.maximum(absmax, 1e-12)
  q = jnp.clip(jnp.round(w / absmax * 127), -127, 127).astype(jnp.int8)
  return {"int8": q, "absmax": absmax}


def _nf4(w, n_in):
  """NF4 codes of blocks of NF4_BLOCK values along the last axis (a
  smaller block when the axis is shorter), packed two per uint8."""
  del n_in
  w = jnp.asarray(w, jnp.float32)
  last = w.shape[-1]
  block = math.gcd(last, NF4_BLOCK)
  if last % 2:
    raise ValueError(f"nf4 needs an even last axis; got shape {w.shape}")
  blocks = w.reshape(w.shape[:-1] + (last // block, block))
  absmax = jnp.maximum(jnp.max(jnp.abs(blocks), -1, keepdims=True), 1e-12)
  x = (blocks / absmax)[..., None]  # [..., nb, block, 1] in [-1, 1]
  book = jnp.asarray(NF4).reshape((1,) * (x.ndim - 1) + (len(NF4),))
  codes = jnp.argmin(jnp.abs(x - book), axis=-1)
  codes = codes.reshape(w.shape).astype(jnp.uint8)
  packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
  return {"codes": packed, "absmax": absmax[..., 0]}


def dequantize(q: dict, dtype=jnp.float32) -> jax.Array:
  if "int8" in q:
    return (q["int8"].astype(jnp.float32) * (q["absmax"] / 127)).astype(dtype)
  packed, absmax = q["codes"], q["absmax"]
  codes = jnp.stack([packed & 15, packed >> 4], axis=-1)
  codes = codes.reshape(packed.shape[:-1] + (2 * packed.shape[-1],))
  values = jnp.asarray(NF4)[codes.astype(jnp.int32)]
  nb = absmax.shape[-1]
  values = values.reshape(values.shape[:-1] + (nb, -1)) * absmax[..., None]
  return values.reshape(codes.shape).astype(dtype)


def quantized_axes(param_axes: dict, base: dict) -> dict:
  """Logical axes of a quantize()d base: codes keep the kernel's axes
  (nf4's packed last axis too: indivisible splits stay replicated);
  absmax keeps the axes of its non-unit dims."""
  leaves = {}
  for layer, group, name in _targets(base, TARGETS["all"]):
    q = base[layer][group][name]
    if not _quantized(q):
      continue
    ax = param_axes[layer][group][name]
    values = "int8" if "int8" in q else "codes"
    scale = tuple(
      None if n == 1 else a for a, n in zip(ax, q["absmax"].shape, strict=True)
    )
    leaves[(layer, group, name)] = {values: ax, "absmax": scale}
  return _replaced(param_axes, leaves)
