"""The policy as pure functions of params: logits, token log-probs, entropy.

Shapes: N sequences, S tokens, P prompt length, T = S - P completion length,
V vocab. Prompts are left padded; padding has position -1 (see
model/transformer.py).

`completion_logprobs` never materialises the [N, T, V] logits unless asked
for them: above LOGITS_CHUNK_BYTES it scores the completion in chunks of
tokens under remat (the peak is one [N, chunk, V] block, in the forward and
the backward pass), with the same numbers as one block. The jitted
functions are keyed on the active activation mesh (mesh.activation_mesh),
so a trace with sharding constraints is never reused without them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rlreason import mesh as mesh_lib
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of softmax(logits) over the last axis, [..., V] -> [...].

    H = -sum_v p_v log p_v,   log p = log_softmax(logits)
  Computed in float32; masked-out vocab entries (-inf logits) contribute 0
  to the value and the gradient (no 0 * -inf).
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  p = jnp.exp(logp)
  return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """[N, S] 1 for real tokens -> positions counting real tokens, -1 on pad."""
  mask = mask.astype(jnp.int32)
  return jnp.where(mask > 0, jnp.cumsum(mask, axis=-1) - 1, -1)


# Above this many bytes of float32 [N, T, V] logits, score in token chunks.
LOGITS_CHUNK_BYTES = 1 << 30


def logits(
  params,
  tokens: jax.Array,
  model_cfg: ModelConfig,
  positions: jax.Array | None = None,
) -> jax.Array:
  """Full forward. tokens [N, S] (positions 0..S-1 by default) -> [N, S, V]."""
  return _logits(params, tokens, model_cfg, positions, mesh_lib.active_mesh())


@functools.partial(jax.jit, static_argnames=("model_cfg", "act_mesh"))
def _logits(params, tokens, model_cfg, positions, act_mesh):
  with mesh_lib.activation_mesh(act_mesh):
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    out, _ = transformer.apply(params, tokens, positions, model_cfg)
    return out


def log_softmax_at(
  logits_: jax.Array,
  targets: jax.Array,
  temperature: float = 1.0,
  *,
  onehot: bool = False,
) -> jax.Array:
  """log softmax(logits / temperature)[target]. [..., V], [...] -> [...].

  onehot: pick the target's logit by a masked sum over V (the same value)
  instead of a gather, which stays elementwise when V is split over
  devices."""
  z = logits_.astype(jnp.float32) / temperature
  if onehot:
    vocab = jnp.arange(z.shape[-1]).reshape((1,) * targets.ndim + (-1,))
    hit = vocab == targets[..., None]
    picked = jnp.sum(jnp.where(hit, z, 0.0), axis=-1)
  else:
    picked = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


def entropy(logits_: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Entropy of softmax(logits / temperature) in nats. [..., V] -> [...]."""
  return entropy_from_logits(logits_.astype(jnp.float32) / temperature)


def completion_logprobs(
  params,
  tokens: jax.Array,
  positions: jax.Array,
  model_cfg: ModelConfig,
  prompt_len: int,
  *,
  temperature: float = 1.0,
  with_entropy: bool = False,
  with_logits: bool = False,
):
  """Log-prob of every completion token under the policy.

  Args:
    params: model parameters.
    tokens: [N, S] prompt (left padded, length P) followed by the completion.
    positions: [N, S]; -1 on padding.
    model_cfg: the architecture.
    prompt_len: P (static).
    temperature: the losses score under logits / temperature, as the peers
      do (research/peers.md).
    with_entropy: also return the per-token entropy [N, T].
    with_logits: also return the scored logits, logits / temperature in
      float32 [N, T, V], for losses that need the whole distribution (e.g.
      entropy_reg.py). Call it inside a jitted loss or reduction: [N, T, V]
      is large.

  Returns:
    logp [N, T] with logp[:, t] = log pi(tokens[:, P + t] | tokens[:, :P + t]),
    then entropy [N, T] if asked, then logits [N, T, V] if asked: a tuple
    when more than logp is asked for.
  """
  n, t = tokens.shape[0], tokens.shape[1] - prompt_len
  chunk = None
  if not with_logits:
    chunk = logits_chunk(n, t, model_cfg.vocab_size)
  return _completion_logprobs(
    params,
    tokens,
    positions,
    model_cfg,
    prompt_len,
    temperature=temperature,
    with_entropy=with_entropy,
    with_logits=with_logits,
    chunk=chunk,
    act_mesh=mesh_lib.active_mesh(),
  )


def by_rows(fn, rows: int, *arrays):
  """fn(*arrays) computed `rows` rows at a time (0 = all at once) and
  concatenated along rows: whole-rollout forwards (reference / old
  log-probs, critic values, self-scoring rewards) hold one micro-batch's
  activations, not the rollout's. fn maps [n, ...] arrays to an [n, ...]
  array or a tuple of them. Not for use under jit (it loops on the host).
  """
  n = arrays[0].shape[0]
  if not rows or rows >= n:
    return fn(*arrays)
  parts = [fn(*(a[i : i + rows] for a in arrays)) for i in range(0, n, rows)]
  if isinstance(parts[0], tuple):
    return tuple(jnp.concatenate(p) for p in zip(*parts))
  return jnp.concatenate(parts)


def completion_logprobs_by_rows(
  params, tokens, positions, model_cfg, prompt_len, *, rows: int, **kwargs
):
  """completion_logprobs over `rows` rows per call (by_rows): the same
  numbers with one micro-batch's peak."""
  return by_rows(
    lambda t, p: completion_logprobs(
      params, t, p, model_cfg, prompt_len, **kwargs
    ),
    rows,
    tokens,
    positions,
  )


def logits_chunk(n: int, t: int, vocab: int) -> int | None:
  """Tokens per chunk so that a float32 [n, chunk, V] block stays under
  LOGITS_CHUNK_BYTES; None when the whole [n, t, V] does."""
  if n * t * vocab * 4 <= LOGITS_CHUNK_BYTES:
    return None
  return max(1, min(t, LOGITS_CHUNK_BYTES // (n * vocab * 4)))


@functools.partial(
  jax.jit,
  static_argnames=(
    "model_cfg",
    "prompt_len",
    "with_entropy",
    "with_logits",
    "chunk",
    "act_mesh",
  ),
)
def _completion_logprobs(
  params,
  tokens,
  positions,
  model_cfg,
  prompt_len,
  *,
  temperature,
  with_entropy,
  with_logits,
  chunk,
  act_mesh,
):
  with mesh_lib.activation_mesh(act_mesh):
    hidden, _ = transformer.hidden_states(params, tokens, positions, model_cfg)
    # Only positions P-1 .. S-2 predict completion tokens: skip the vocab
    # projection everywhere else.
    hidden = hidden[:, prompt_len - 1 : -1]
    targets = tokens[:, prompt_len:]
    if chunk is not None:
      return _chunked_scores(
        params, hidden, targets, model_cfg, temperature, with_entropy, chunk
      )
    step_logits = transformer.unembed(params, hidden, model_cfg)  # [N, T, V]
    logp = log_softmax_at(step_logits, targets, temperature)
    out = (logp,)
    if with_entropy:
      out += (entropy(step_logits, temperature),)
    if with_logits:
      out += (step_logits.astype(jnp.float32) / temperature,)
    return out if len(out) > 1 else logp


def _chunked_scores(
  params, hidden, targets, model_cfg, temperature, with_entropy, chunk
):
  """logp (and entropy) [N, T] from hidden [N, T, D], `chunk` tokens at a
  time: a scan whose rematerialised body holds one [N, chunk, V] block."""
  n, t, d = hidden.shape
  pad = -t % chunk
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  c = (t + pad) // chunk
  hs = hidden.reshape(n, c, chunk, d).swapaxes(0, 1)  # [C, N, chunk, D]
  ys = targets.reshape(n, c, chunk).swapaxes(0, 1)
  # On a mesh, the vocab projection is vocab-parallel: each device scores
  # V / devices of the vocab for every row of the chunk (the chunk's hidden
  # states gathered: [N, chunk, D] is small), so neither the projection's
  # weight nor the fp32 gradient the scan accumulates for it is ever whole
  # [D, V] on a device; softmax sums run across devices.
  split = mesh_lib.vocab_axes(model_cfg.vocab_size)
  name, w_spec = "lm_head", P(None, split)
  if model_cfg.tie_embeddings:
    name, w_spec = "embedding", P(split, None)

  @jax.checkpoint
  def body(carry, xs):
    h, y = xs
    head = params
    if split:
      w = mesh_lib.constrain_spec(params[name], w_spec)
      head = {**params, name: w}
      h = mesh_lib.constrain_spec(h, P())
    block = transformer.unembed(head, h, model_cfg)  # [N, chunk, V]
    if split:
      block = mesh_lib.constrain_spec(block, P(None, None, split))
    logp = log_softmax_at(block, y, temperature, onehot=bool(split))
    ent = entropy(block, temperature) if with_entropy else jnp.zeros_like(logp)
    return carry, (logp, ent)

  _, (logp, ent) = jax.lax.scan(body, None, (hs, ys))
  logp = logp.swapaxes(0, 1).reshape(n, c * chunk)[:, :t]
  if not with_entropy:
    return logp
  return logp, ent.swapaxes(0, 1).reshape(n, c * chunk)[:, :t]
