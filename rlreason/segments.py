"""Decoding in segments over one KV cache: the primitives of multi-turn and
tree rollouts (multiturn.py, tree.py).

  logits, cache = segments.extend(params, cache, tokens, positions,
                                  model_cfg=model_cfg)
  seg, cache = segments.decode(params, cache, logits, start_pos, active, rng,
                               model_cfg=model_cfg, max_new_tokens=T, ...)

`extend` writes a left-padded block of tokens (a prompt, an observation, a
re-fed fork token) into the cache and returns the next-token logits;
`decode` samples a segment with a lax.while_loop as sampling.sample does,
but leaves every row's last token unfed, so the caller decides what follows
it (an observation, nothing, a fork). Both are jitted with static shapes:
a run compiles each once. The cache write index is shared by all rows;
rows that are idle feed padding (position -1), which is never attended.

Shapes: N rows, Q block length, Tt segment length, V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import functools

from rlreason import policy
from rlreason.model import transformer


def _cast(params, model_cfg):
  dt = model_cfg.compute_dtype
  return jax.tree.map(
    lambda w: w.astype(dt) if jnp.issubdtype(w.dtype, jnp.floating) else w,
    params,
  )


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def extend(params, cache, tokens, positions, *, model_cfg):
  """Writes tokens [N, Q] (left padded) into the cache.

  Returns the logits [N, V] after the last column (the next token's
  distribution for rows whose last column is real) and the cache.
  """
  params = _cast(params, model_cfg)
  hidden, cache = transformer.hidden_states(
    params, tokens, positions, model_cfg, cache
  )
  return transformer.unembed(params, hidden[:, -1], model_cfg), cache


class Segment(NamedTuple):
  """One turn of `decode`: tokens, logp, policy_logp, entropy [N, Tt];
  lengths [N]; stopped [N] (ended on a stop id)."""

  tokens: jax.Array
  logp: jax.Array
  policy_logp: jax.Array
  entropy: jax.Array
  lengths: jax.Array
  stopped: jax.Array


@functools.partial(
  jax.jit,
  static_argnames=(
    "model_cfg",
    "max_new_tokens",
    "sampling",
    "stop_ids",
    "pad_id",
  ),
)
def decode(
  params,
  cache,
  logits,
  start_pos,
  active,
  rng,
  *,
  model_cfg,
  max_new_tokens,
  sampling,
  stop_ids,
  pad_id,
) -> tuple[Segment, transformer.Cache]:
  """Samples up to max_new_tokens tokens per active row, from `logits`.

  Token j of row n has position start_pos[n] + j. Unlike sampling.sample,
  a row's last token (its stop token, or token Tt - 1) is never fed to the
  model: the caller feeds it in front of the next observation (`extend`).
  Step j draws with fold_in(rng, j).

  Args:
    params, cache: the model and its cache (already holding the context).
    logits: [N, V] distribution of token 0.
    start_pos: [N] int32 position of token 0.
    active: [N] bool; inactive rows sample nothing (length 0).
    rng: a key.
    model_cfg, max_new_tokens, sampling, stop_ids, pad_id: static.

  Returns:
    (Segment, cache).
  """
  n, t_max = logits.shape[0], max_new_tokens
  cparams = _cast(params, model_cfg)
  stop = jnp.asarray(stop_ids, jnp.int32)
  z = lambda dt: jnp.zeros((n, t_max), dt)

  def record(carry, logits):
    j, done, lengths, tok, toks, logp, plogp, ent, cache = carry
    new, lp, plp = sampling.draw(logits, jax.random.fold_in(rng, j))
    h = policy.entropy(logits)  # of the untempered policy
    alive = ~done
    new = jnp.where(alive, new, pad_id)
    col = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
      buf, jnp.where(alive, x, 0).astype(buf.dtype)[:, None], j, axis=1
    )
    is_stop = jnp.any(new[:, None] == stop[None, :], axis=-1)
    return (
      j + 1,
      done | (alive & is_stop),
      lengths + alive.astype(jnp.int32),
      new,
      jax.lax.dynamic_update_slice_in_dim(toks, new[:, None], j, axis=1),
      col(logp, lp),
      col(plogp, plp),
      col(ent, h),
      cache,
    )

  carry = (
    jnp.zeros((), jnp.int32),
    ~active,
    jnp.zeros((n,), jnp.int32),
    jnp.zeros((n,), jnp.int32),
    jnp.full((n, t_max), pad_id, jnp.int32),
    z(jnp.float32),
    z(jnp.float32),
    z(jnp.float32),
    cache,
  )
  carry = record(carry, logits)

  def cond(carry):
    return (carry[0] < t_max) & ~jnp.all(carry[1])

  def body(carry):
    j, done, tok, cache = carry[0], carry[1], carry[3], carry[-1]
    # Only rows still sampling feed their last token (position j - 1).
    pos = jnp.where(done, -1, start_pos + j - 1)
    hidden, cache = transformer.hidden_states(
      cparams, tok[:, None], pos[:, None], model_cfg, cache
    )
    logits = transformer.unembed(cparams, hidden[:, -1], model_cfg)
    return record(carry[:-1] + (cache,), logits)

  carry = jax.lax.while_loop(cond, body, carry)
  _, done, lengths, _, toks, logp, plogp, ent, cache = carry
  stopped = done & active
  return Segment(toks, logp, plogp, ent, lengths, stopped), cache
