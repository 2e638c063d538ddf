"""The policy as pure functions of params: logits, token log-probs, entropy.

Shapes: N sequences, S tokens, P prompt length, T = S - P completion length,
V vocab. Prompts are left padded; padding has position -1 (see
model/transformer.py).
"""

import functools

import jax
import jax.numpy as jnp

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


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def logits(
  params,
  tokens: jax.Array,
  model_cfg: ModelConfig,
  positions: jax.Array | None = None,
) -> jax.Array:
  """Full forward. tokens [N, S] (positions 0..S-1 by default) -> [N, S, V]."""
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  out, _ = transformer.apply(params, tokens, positions, model_cfg)
  return out


def log_softmax_at(
  logits_: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> jax.Array:
  """log softmax(logits / temperature)[target]. [..., V], [...] -> [...]."""
  z = logits_.astype(jnp.float32) / temperature
  picked = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


def entropy(logits_: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Entropy of softmax(logits / temperature) in nats. [..., V] -> [...]."""
  return entropy_from_logits(logits_.astype(jnp.float32) / temperature)


@functools.partial(
  jax.jit,
  static_argnames=("model_cfg", "prompt_len", "with_entropy", "with_logits"),
)
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
  hidden, _ = transformer.hidden_states(params, tokens, positions, model_cfg)
  # Only positions P-1 .. S-2 predict completion tokens: skip the vocab
  # projection everywhere else.
  hidden = hidden[:, prompt_len - 1 : -1]
  step_logits = transformer.unembed(params, hidden, model_cfg)  # [N, T, V]
  logp = log_softmax_at(step_logits, tokens[:, prompt_len:], temperature)
  out = (logp,)
  if with_entropy:
    out += (entropy(step_logits, temperature),)
  if with_logits:
    out += (step_logits.astype(jnp.float32) / temperature,)
  return out if len(out) > 1 else logp
