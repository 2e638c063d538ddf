"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 families in Flax linen.

RMSNorm, grouped-query attention (rotary embeddings, llama3 rope scaling and
the masked attention over the cache are in attention.py), SwiGLU MLP and,
optionally, q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings.
The layers are in blocks.py; here the config, the cache, the stack and the
functional API.

The forward is a pure function of (params, tokens, positions, cache):

  logits, cache = apply(params, tokens, positions, model_cfg, cache=cache)

Shapes: N sequences, Q tokens in this call, S cache length, V vocab, D model
dim, H / K query / kv heads, Dh head dim, F mlp dim, L layers.

Padding: a position < 0 marks a padding token; it is never attended to, and
its own output is garbage the caller must mask. Causality is by slot order, so
left-padded prompts work with positions from 0 at the first real token.

KV cache: `init_cache(model_cfg, N, S)` gives fixed-size [N, K, S, Dh] buffers
(no transpose of the cache when decoding). Each call writes its Q tokens at
slots [index, index + Q) and advances index; all rows share the write index
(prompts are left padded so that they end together), or, with an index [N],
each row writes at its own (continuous batching, sampling/continuous.py).
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib
from rlreason.model import attention
from rlreason.model import blocks

Params = Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder. Hashable, so it can be a static jit argument.

  `rope_scaling` is None or the llama3 form as a tuple
  (factor, low_freq_factor, high_freq_factor, original_max_position).
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  rope_scaling: tuple[float, float, float, int] | None = None
  rms_eps: float = 1e-6
  qkv_bias: bool = False  # Qwen2
  o_bias: bool = False  # Llama with attention_bias=True
  qk_norm: bool = False  # Qwen3
  tie_embeddings: bool = False
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  remat: bool = False  # rematerialise each layer in the backward pass
  # What a rematerialised layer keeps: "full" only its input (least
  # memory), "dots" its matmul outputs too (less recompute, more memory),
  # "offload" only its input, in the host's memory (XLA copies it out in
  # the forward and back for the backward, so the device holds no layer's
  # saved input; one memory on CPU).
  remat_policy: str = "full"
  # Sequence parallelism (Megatron-LM's, over the mesh's `tensor` axis):
  # between layers the residual stream's tokens are split over `tensor`
  # instead of held whole on each of its devices, so each layer's saved
  # input (what a rematerialised layer keeps) and its norms take 1/tensor
  # of the memory; a layer gathers its tokens before attention and the
  # MLP and scatters their sums after. The same numbers; off without a
  # tensor split, and for a length `tensor` does not divide (a decode
  # step).
  sequence_parallel: bool = False
  # A full forward's layers as one lax.scan (blocks.scan): XLA compiles
  # one layer, not L. The parameter tree keeps `layer_{i}`; a call stacks
  # the weights in the compute dtype (a copy, and in the backward one of
  # their gradient, sharded as the weights are). The same numbers. The
  # sampler's cached calls stay unrolled (no stack of its replicated
  # weights); so do layers whose parameters differ in structure.
  scan_layers: bool = False
  max_position: int = 4096  # informational (HF max_position_embeddings)
  family: str = "qwen2"  # HF family written by hf.save: llama, qwen2, qwen3
  # attention.IMPLEMENTATIONS (auto: splash on TPU, cuDNN on GPU, else
  # blockwise for long multi-token inputs; dense for decoding): none but
  # dense holds [.., Q, S] scores.
  attention: str = "auto"
  attention_block: int = 512
  # A decode step's attention (attention.DECODE_IMPLEMENTATIONS): "ragged"
  # reads each row's filled slots only; set by the static and continuous
  # samplers (their cache layout), not for other forwards.
  decode_attention: str = "dense"
  # The sampler's parameter layout (rollout_layout.on_mesh) stacks each
  # MLP's gate and up kernels into one [D, 2, F] kernel: one product per
  # decode step instead of two, 1.5x faster at 256 rows on an H100
  # (bench.decode_gemms). Training's parameters keep HF's two kernels.
  stack_gate_up: bool = True
  # The sampler's parameters over the mesh (mesh.ROLLOUT_LAYOUTS): auto
  # replicates them over data / fsdp where they fit (mesh.rollout_rules).
  rollout_layout: str = "auto"
  # The sampler's tensor split (mesh.rollout_mesh; 0: the mesh's own).
  rollout_tensor: int = 0

  def __post_init__(self):
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
        f"n_heads={self.n_heads} is not a multiple of "
        f"n_kv_heads={self.n_kv_heads}"
      )
    if self.attention not in attention.IMPLEMENTATIONS:
      raise ValueError(
        f"attention={self.attention!r}; expected one of "
        f"{', '.join(attention.IMPLEMENTATIONS)}"
      )
    if self.decode_attention not in attention.DECODE_IMPLEMENTATIONS:
      raise ValueError(
        f"decode_attention={self.decode_attention!r}; expected one of "
        f"{', '.join(attention.DECODE_IMPLEMENTATIONS)}"
      )
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in blocks.DTYPES:
        raise ValueError(
          f"{name}={getattr(self, name)!r}; expected one of "
          f"{sorted(blocks.DTYPES)}"
        )

  @property
  def compute_dtype(self):
    return blocks.DTYPES[self.dtype]

  def num_params(self) -> int:
    attn = (
      self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
    )
    layer = attn + 3 * self.d_model * self.mlp_dim + 2 * self.d_model
    emb = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
    return self.n_layers * layer + emb + self.d_model


def flops_per_token(model_cfg, context: int) -> float:
  """Forward + backward model FLOPs per trained token at `context` tokens
  (PaLM's appendix B: 6 per parameter + the attention's), of a ModelConfig
  or anything with its num_params() and sizes."""
  attn = 12 * model_cfg.n_layers * model_cfg.n_heads * model_cfg.head_dim
  return 6 * model_cfg.num_params() + attn * context / 2


def compute_params(params, model_cfg: ModelConfig, copy: bool = False):
  """Floating weights cast to the compute dtype; the same numbers, as the
  model casts each weight to it before its matmul. A frozen model (the
  reference, a teacher, a judge) kept so, or a decode loop reading it,
  takes half the bytes of float32 weights in bf16 runs. `copy`: the
  result shares no buffer with `params` (which a train step may donate);
  otherwise leaves already in the dtype are returned as they are."""
  dt = model_cfg.compute_dtype

  def cast(x):
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt:
      return x.astype(dt)
    return x.copy() if copy else x

  return jax.tree.map(cast, params)


# Logical axes of a cache buffer: [N, K, S, Dh], so a decode step attends
# without transposing the cache (sampling.py constrains it by these names).
CACHE_AXES = ("batch", "kv_heads", "seq", "head_dim")


class Cache(NamedTuple):
  """KV cache. k, v: per layer [N, K, S, Dh]; pos: [N, S] position of each
  slot (-1 = empty or padding); index: [] next slot to write, or [N] one
  per row."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  pos: jax.Array
  index: jax.Array


def init_cache(
  model_cfg: ModelConfig, n: int, length: int, dtype=None
) -> Cache:
  """Empty cache of `length` slots for `n` sequences."""
  dtype = dtype or model_cfg.compute_dtype
  shape = (n, model_cfg.n_kv_heads, length, model_cfg.head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(model_cfg.n_layers))
  return Cache(
    k=zeros,
    v=zeros,
    pos=jnp.full((n, length), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
  )


class Transformer(nn.Module):
  """The decoder. `__call__` returns hidden states; `unembed` the logits."""

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    pdt = blocks.DTYPES[cfg.param_dtype]
    self.embedding = blocks.param(
      self,
      "embedding",
      ("vocab", "embed"),
      (cfg.vocab_size, cfg.d_model),
      blocks.KERNEL_INIT,
      pdt,
    )
    if not cfg.tie_embeddings:
      self.lm_head = blocks.param(
        self,
        "lm_head",
        ("embed", "vocab"),
        (cfg.d_model, cfg.vocab_size),
        blocks.KERNEL_INIT,
        pdt,
      )
    block = blocks.Block
    if cfg.remat:
      block = nn.remat(
        blocks.Block, policy=blocks.REMAT_POLICIES[cfg.remat_policy]
      )
    self.layers = [block(cfg, name=f"layer_{i}") for i in range(cfg.n_layers)]
    self.final_norm = blocks.RMSNorm(cfg.rms_eps, pdt)

  def __call__(self, tokens, positions, cache: Cache | None = None):
    """No cache: a full forward (attending within the block), which
    ModelConfig.scan_layers runs under lax.scan."""
    full = cache is None
    if full:
      cache = init_cache(self.cfg, tokens.shape[0], tokens.shape[1])
    x = blocks.embed(self.embedding, tokens, self.cfg.compute_dtype)
    x = mesh_lib.constrain(x, blocks.residual(self.cfg))
    slot_pos = attention.write_slots(
      cache.pos, positions.astype(jnp.int32), cache.index, axis=1
    )
    layer_params = self._scanned_layers() if full else None
    if layer_params is not None:
      x, ks, vs = blocks.scan(
        self.cfg, layer_params, x, positions, cache, slot_pos
      )
    else:
      ks, vs = [], []
      for i, layer in enumerate(self.layers):
        x, k, v = layer(
          x, positions, cache.k[i], cache.v[i], slot_pos, cache.index
        )
        ks.append(k)
        vs.append(v)
    new_cache = Cache(
      k=tuple(ks),
      v=tuple(vs),
      pos=slot_pos,
      index=cache.index + tokens.shape[1],
    )
    return self.final_norm(x), new_cache

  def _scanned_layers(self):
    """The layers' parameters stacked along a leading [L] axis, in the
    compute dtype, when a full forward runs them under lax.scan
    (ModelConfig.scan_layers); None when it unrolls them."""
    cfg = self.cfg
    if not cfg.scan_layers or self.is_initializing():
      return None
    params = self.variables["params"]
    layers = [params[f"layer_{i}"] for i in range(cfg.n_layers)]
    return blocks.stack_layers(layers, cfg.compute_dtype)

  def unembed(self, hidden):
    """hidden [..., D] -> fp32 logits [..., V]."""
    w = self.embedding.T if self.cfg.tie_embeddings else self.lm_head
    return logits_dot(hidden, w.astype(hidden.dtype))

  def forward(self, tokens, positions, cache: Cache | None = None):
    hidden, cache = self(tokens, positions, cache)
    return self.unembed(hidden), cache


@jax.custom_vjp
def logits_dot(hidden: jax.Array, w: jax.Array) -> jax.Array:
  """hidden [..., D] @ w [D, V] -> fp32 logits, accumulated in fp32.

  The backward's two products take the logits' fp32 cotangent in the
  inputs' dtype, as every other layer's do: left to autodiff, fp32 cotangent
  x bf16 weights promote to fp32 products (TF32 on a GPU: 272 ms of a 2.36 s
  1.5B train step on an H100, bench.measured_vs_planned --profile_top).
  With fp32 inputs this is the plain product's gradient.
  """
  return jnp.dot(hidden, w, preferred_element_type=jnp.float32)


def _logits_dot_fwd(hidden, w):
  return logits_dot(hidden, w), (hidden, w)


def _logits_dot_bwd(res, g):
  hidden, w = res
  g = g.astype(hidden.dtype)
  d_hidden = jnp.dot(g, w.T, preferred_element_type=jnp.float32)
  d_w = jnp.tensordot(
    hidden,
    g,
    axes=(tuple(range(hidden.ndim - 1)),) * 2,
    preferred_element_type=jnp.float32,
  )
  return d_hidden.astype(hidden.dtype), d_w.astype(w.dtype)


logits_dot.defvjp(_logits_dot_fwd, _logits_dot_bwd)


# --- Functional API -----------------------------------------------------------


def _dummy_inputs(model_cfg):
  tokens = jnp.zeros((1, 1), jnp.int32)
  return tokens, tokens, init_cache(model_cfg, 1, 1)


def _boxed_init(model_cfg: ModelConfig, rng):
  model = Transformer(model_cfg)
  variables = model.init(
    rng, *_dummy_inputs(model_cfg), method=Transformer.forward
  )
  return variables["params"]


@functools.partial(jax.jit, static_argnums=0)
def init(model_cfg: ModelConfig, rng: jax.Array) -> Params:
  """Random parameters as a plain pytree of arrays."""
  return nn.meta.unbox(_boxed_init(model_cfg, rng))


def param_axes(model_cfg: ModelConfig) -> Params:
  """Pytree of logical-axis-name tuples, with the structure of the params."""
  boxed = jax.eval_shape(
    functools.partial(_boxed_init, model_cfg), jax.random.key(0)
  )
  specs = nn.get_partition_spec(boxed)
  return jax.tree.map(
    tuple, specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
  )


def param_shapes(model_cfg: ModelConfig) -> Params:
  """Pytree of jax.ShapeDtypeStruct, with the structure of the params."""
  return jax.eval_shape(functools.partial(init, model_cfg), jax.random.key(0))


def rollout_param_tree(model_cfg: ModelConfig) -> tuple[Params, Params]:
  """(shapes, logical axes) of the parameters as the sampler holds them
  (rollout_layout.on_mesh): param_shapes / param_axes, each MLP's gate and up
  kernels stacked when model_cfg.stack_gate_up (blocks.stack_gate_up)."""
  shapes, axes = param_shapes(model_cfg), param_axes(model_cfg)
  if model_cfg.stack_gate_up:
    shapes = jax.eval_shape(blocks.stack_gate_up, shapes)
    axes = blocks.stack_gate_up(axes, lambda g, u: (g[0], None, g[1]))
  return shapes, axes


def hidden_states(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  model_cfg: ModelConfig,
  cache: Cache | None = None,
) -> tuple[jax.Array, Cache]:
  """tokens, positions [N, Q] -> final-norm hidden [N, Q, D] and the cache.

  Without a cache the call attends within the block only (a full forward).
  """
  return Transformer(model_cfg).apply(
    {"params": params}, tokens, positions, cache
  )


def unembed(
  params: Params, hidden: jax.Array, model_cfg: ModelConfig
) -> jax.Array:
  """hidden [..., D] -> fp32 logits [..., V]."""
  return Transformer(model_cfg).apply(
    {"params": params}, hidden, method=Transformer.unembed
  )


def apply(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  model_cfg: ModelConfig,
  cache: Cache | None = None,
) -> tuple[jax.Array, Cache]:
  """tokens, positions [N, Q] -> fp32 logits [N, Q, V] and the updated cache
  (without one, a full forward's)."""
  return Transformer(model_cfg).apply(
    {"params": params}, tokens, positions, cache, method=Transformer.forward
  )
