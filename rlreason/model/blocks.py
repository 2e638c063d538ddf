"""The decoder's layers in Flax linen: RMSNorm, grouped-query attention, the
SwiGLU MLP, the pre-norm block (transformer.py stacks them) and the
embedding lookup (`embed`, with its own VJP).

Each layer reads its architecture from a transformer.ModelConfig (`cfg`);
shapes as in transformer.py. A parameter is created by `param`, which also
forms a LoRA-adapted or quantised kernel's weight at use (lora.effective).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rlreason import mesh as mesh_lib
from rlreason.model import attention
from rlreason.model import lora

DTYPES = {
  "float32": jnp.float32,
  "bfloat16": jnp.bfloat16,
  "float16": jnp.float16,
}


def param(module, name, axes, shape, init, dtype):
  # A LoRA-adapted or quantised kernel is a dict leaf (lora.combine /
  # lora.quantize): the weight it stands for is formed here, at use.
  if module.has_variable("params", name):
    return lora.effective(module.get_variable("params", name))
  return module.param(
    name, nn.with_logical_partitioning(init, axes), shape, dtype
  )


KERNEL_INIT = nn.initializers.normal(stddev=0.02)


def gathered_at(w, x):
  """Weight w (in the compute dtype), not to be read before x exists.

  On a mesh, an FSDP-split weight is gathered where it is used. A layer's
  weights depend on nothing computed, so XLA may gather every layer's at
  the start of a forward (its scheduler did: a 32B truncated_ppo train
  step for v5p-256 held all 64 layers' gathered weights, policy and
  critic, at its peak). Tied to the layer's input x (an optimization
  barrier), a layer's weights are gathered when it starts: the MLP's
  while the attention computes. Identity without a mesh, and when x is
  one token per row (a decode step: mesh.ROLLOUT_RULES lay its weights
  out, and a barrier would keep XLA from hoisting anything out of the
  decode loop)."""
  mesh = mesh_lib.active_mesh()
  if mesh is None or mesh.size == 1 or x.ndim < 2 or x.shape[-2] == 1:
    return w
  w, _ = jax.lax.optimization_barrier((w, x))
  return w


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, normalised in fp32 (as HF)."""

  eps: float
  param_dtype: Any
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x):
    scale = param(
      self,
      "scale",
      (self.axis_name,),
      (x.shape[-1],),
      nn.initializers.ones,
      self.param_dtype,
    )
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    scale = scale.reshape((1,) * (x.ndim - 1) + scale.shape)
    return scale.astype(x.dtype) * x32.astype(x.dtype)


class Attention(nn.Module):
  """Grouped-query attention over an explicit cache."""

  cfg: Any  # a transformer.ModelConfig

  @nn.compact
  def __call__(
    self, x, positions, k_cache, v_cache, slot_pos, index, ready=None
  ):
    """`ready`: the weights wait for it (gathered_at; default x)."""
    cfg = self.cfg
    dt, pdt = cfg.compute_dtype, DTYPES[cfg.param_dtype]
    d, h, k, dh = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    ready = x if ready is None else ready

    def proj(name, heads, axes):
      w = param(
        self,
        f"{name}_kernel",
        ("embed", axes, "head_dim"),
        (d, heads, dh),
        KERNEL_INIT,
        pdt,
      )
      y = jnp.einsum("nqd,dhk->nqhk", x, gathered_at(w.astype(dt), ready))
      if cfg.qkv_bias:
        b = param(
          self,
          f"{name}_bias",
          (axes, "head_dim"),
          (heads, dh),
          nn.initializers.zeros,
          pdt,
        )
        y = y + b.astype(dt)[None, None]
      return y

    q = proj("q", h, "heads")  # [N, Q, H, Dh]
    kk = proj("k", k, "kv_heads")  # [N, Q, K, Dh]
    vv = proj("v", k, "kv_heads")
    if cfg.qk_norm:  # Qwen3: per-head RMSNorm before rotary.
      q = RMSNorm(cfg.rms_eps, pdt, "head_dim", name="q_norm")(q)
      kk = RMSNorm(cfg.rms_eps, pdt, "head_dim", name="k_norm")(kk)
    inv_freq = attention.rope_frequencies(cfg)
    rope_pos = jnp.maximum(positions, 0)
    q = attention.apply_rope(q, rope_pos, inv_freq)
    kk = attention.apply_rope(kk, rope_pos, inv_freq)
    out, k_cache, v_cache = attention.attend(
      q,
      kk,
      vv,
      k_cache,
      v_cache,
      slot_pos,
      index,
      dt,
      impl=cfg.attention,
      block=cfg.attention_block,
      decode=cfg.decode_attention,
    )
    wo = param(
      self,
      "o_kernel",
      ("heads", "head_dim", "embed"),
      (h, dh, d),
      KERNEL_INIT,
      pdt,
    )
    y = jnp.einsum("nqhk,hkd->nqd", out, gathered_at(wo.astype(dt), ready))
    if cfg.o_bias:
      y = (
        y
        + param(
          self, "o_bias", ("embed",), (d,), nn.initializers.zeros, pdt
        ).astype(dt)[None, None]
      )
    return y, k_cache, v_cache


GATE_UP = "gate_up_kernel"


def stack_gate_up(tree, combine=None):
  """Each MLP's gate_kernel and up_kernel [D, F] in `tree` (parameters, or
  any tree of their structure) replaced by one GATE_UP kernel
  combine(gate, up), by default stacked as [D, 2, F]: Mlp then makes one
  product of the two (the sampler's layout, ModelConfig.stack_gate_up).
  LoRA-adapted or quantised kernels (dict leaves) are left as they are."""
  if combine is None:
    combine = lambda g, u: jnp.stack([g, u], axis=1)  # noqa: E731
  if not isinstance(tree, dict):
    return tree
  out = {k: stack_gate_up(v, combine) for k, v in tree.items()}
  gate, up = out.get("gate_kernel"), out.get("up_kernel")
  if (
    gate is None or up is None or isinstance(gate, dict) or isinstance(up, dict)
  ):
    return out
  del out["gate_kernel"], out["up_kernel"]
  out[GATE_UP] = combine(gate, up)
  return out


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  cfg: Any  # a transformer.ModelConfig

  @nn.compact
  def __call__(self, x, ready=None):
    """`ready`: the weights wait for it (gathered_at; default x)."""
    cfg = self.cfg
    dt, pdt = cfg.compute_dtype, DTYPES[cfg.param_dtype]
    d, f = cfg.d_model, cfg.mlp_dim
    ready = x if ready is None else ready
    if self.has_variable("params", GATE_UP):  # the sampler's layout
      both = self.get_variable("params", GATE_UP).astype(dt)
      y = jnp.einsum("...d,dtf->...tf", x, both)
      hidden = jax.nn.silu(y[..., 0, :]) * y[..., 1, :]
    else:
      gate = param(
        self, "gate_kernel", ("embed", "mlp"), (d, f), KERNEL_INIT, pdt
      )
      up = param(self, "up_kernel", ("embed", "mlp"), (d, f), KERNEL_INIT, pdt)
      gate, up = (gathered_at(w.astype(dt), ready) for w in (gate, up))
      hidden = jax.nn.silu(x @ gate) * (x @ up)
    down = param(
      self, "down_kernel", ("mlp", "embed"), (f, d), KERNEL_INIT, pdt
    )
    hidden = mesh_lib.constrain(hidden, ("batch", "seq", "mlp"))
    return hidden @ gathered_at(down.astype(dt), ready)


RESIDUAL = ("batch", "seq", "embed")  # the residual stream's layout
# ... with sequence parallelism (ModelConfig.sequence_parallel): its
# tokens split over `tensor` (mesh.ACTIVATION_RULES).
RESIDUAL_SPLIT = ("batch", "seq_split", "embed")


def residual(cfg) -> tuple:
  """The residual stream's logical axes between layers under `cfg`."""
  return RESIDUAL_SPLIT if cfg.sequence_parallel else RESIDUAL


LAYER_INPUT = "layer_input"  # a layer's input, by jax.ad_checkpoint name

REMAT_POLICIES = {
  "full": None,
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=(),
    names_which_can_be_offloaded=(LAYER_INPUT,),
    offload_src="device",
    offload_dst="pinned_host",
  ),
}


class Block(nn.Module):
  """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x)), the
  residual stream constrained to its batch layout after each."""

  cfg: Any  # a transformer.ModelConfig

  @nn.compact
  def __call__(self, x, positions, k_cache, v_cache, slot_pos, index):
    cfg = self.cfg
    pdt = DTYPES[cfg.param_dtype]
    layout = residual(cfg)
    x = checkpoint_name(x, LAYER_INPUT)
    start = x  # the layer's weights are gathered once it exists
    h = RMSNorm(cfg.rms_eps, pdt, name="input_norm")(x)
    h, k_cache, v_cache = Attention(cfg, name="attn")(
      h, positions, k_cache, v_cache, slot_pos, index, ready=start
    )
    x = mesh_lib.constrain(x + h, layout)
    h = RMSNorm(cfg.rms_eps, pdt, name="post_attn_norm")(x)
    x = mesh_lib.constrain(x + Mlp(cfg, name="mlp")(h, ready=start), layout)
    return x, k_cache, v_cache


def stack_layers(layers: list, dtype):
  """The layers' parameter trees stacked along a leading [L] axis for
  `scan` (ModelConfig.scan_layers), or None when their structures differ
  (LoRA on some layers). A plain weight is cast to `dtype` (the compute
  dtype, as each layer casts it at use) before the stack, so the copy is
  the size of the weights the layers read; a LoRA-adapted or quantised
  kernel (lora.formed) keeps its dtypes and is formed at use as before."""
  if len({jax.tree.structure(p) for p in layers}) > 1:
    return None

  def cast(x):
    if lora.formed(x) or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return x.astype(dtype)

  layers = [jax.tree.map(cast, p, is_leaf=lora.formed) for p in layers]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *layers)


def scan(cfg, stacked, x, positions, cache, slot_pos):
  """The layers as one lax.scan over their stacked parameters
  (stack_layers) and the cache's per-layer buffers: -> x, per-layer k
  and v. With cfg.remat the body is rematerialised under its policy."""

  def layer(x, xs):
    params, k, v = xs
    x, k, v = Block(cfg, parent=None).apply(
      {"params": params}, x, positions, k, v, slot_pos, cache.index
    )
    return x, (k, v)

  if cfg.remat:
    layer = jax.checkpoint(
      layer, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=False
    )
  x, (ks, vs) = jax.lax.scan(
    layer, x, (stacked, jnp.stack(cache.k), jnp.stack(cache.v))
  )
  return x, tuple(ks), tuple(vs)


# The embedding's backward scatter-adds the cotangent into the table's
# gradient in chunks of at most this many positions per row.
EMBED_GRAD_CHUNK = 2048


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def embed(table: jax.Array, tokens: jax.Array, dtype) -> jax.Array:
  """table [V, D] looked up at tokens [..., T] -> [..., T, D] in `dtype`.

  On a mesh the table is split (vocab -> tensor, embed -> fsdp) and the
  tokens by batch: each chip looks up every row's tokens for its columns,
  then the rows are split by batch; the backward goes the other way. Both
  hold [N, T, D / fsdp] per chip (truncated_ppo's v5e-256 train step:
  N = 32 rows of 33,792 tokens, 0.645 GiB in fp32). So the forward casts
  the table to `dtype` before the lookup (the same values; XLA fuses the
  cast into the gather), and the backward converts and scatter-adds the
  compute-dtype cotangent into the table's gradient a chunk of positions
  at a time (embed_chunks), accumulating in the table's dtype (fp32 for
  fp32 parameters) as autodiff's would, where autodiff would convert the
  whole cotangent to fp32 first. Up to the order of fp32 additions, the
  same gradient.
  """
  return jnp.take(table.astype(dtype), tokens, axis=0)


def embed_chunks(length: int) -> int:
  """How many chunks embed's backward splits `length` positions into: the
  fewest that divide it into at most EMBED_GRAD_CHUNK each, or 1 (no
  chunking) when that takes more than twice the fewest possible.

  Chunk i holds positions i, i + chunks, i + 2 * chunks, ...: strided, so
  each chunk takes the same share of every device's positions when a
  sequence-parallel residual splits them (no gather along T).
  """
  fewest = -(-length // EMBED_GRAD_CHUNK)
  for chunks in range(fewest, 2 * fewest + 1):
    if length % chunks == 0:
      return chunks
  return 1


def _embed_fwd(table, tokens, dtype):
  return embed(table, tokens, dtype), (table, tokens)


def _embed_bwd(dtype, res, g):
  del dtype
  table, tokens = res
  grad = jnp.zeros(table.shape, table.dtype)
  chunks = embed_chunks(tokens.shape[-1])
  if chunks == 1:
    return grad.at[tokens].add(g.astype(grad.dtype)), None
  # [..., T] -> [..., T / chunks, chunks]: chunk i is index i of the last.
  tokens = tokens.reshape(*tokens.shape[:-1], -1, chunks)
  g = g.reshape(*tokens.shape, g.shape[-1])
  axis = tokens.ndim - 1

  def add(i, grad):
    tok = jax.lax.dynamic_index_in_dim(tokens, i, axis, keepdims=False)
    g_i = jax.lax.dynamic_index_in_dim(g, i, axis, keepdims=False)
    return grad.at[tok].add(g_i.astype(grad.dtype))

  return jax.lax.fori_loop(0, chunks, add, grad), None


embed.defvjp(_embed_fwd, _embed_bwd)
