"""Decoding in segments over one KV cache: the primitives of multi-turn and
tree rollouts (multiturn.py, tree.py).

  cache = segments.init_cache(model_cfg, n, length, mesh=mesh)
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

A row stops at a stop id or when its last emitted tokens equal one of the
static `stop_sequences` (stops.check, the same test as sampling.sample).
`rewind` hides a row's cache slots from a position on (position -1), so a
caller that cuts a segment short on the host (multiturn.py: a stop string
the token test missed) can continue as if the cut tokens were never fed.

With a `mesh`, every [N, ...] array and the cache are constrained to the
rollout batch sharding (mesh.ROLLOUT_RULES, as sampling.sample), so the
rows are split over the data axes and the loop carries stay split.

Shapes: N rows, Q block length, Tt segment length, S cache slots, V vocab.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlreason.model import policy
from rlreason.sampling import engine
from rlreason.sampling import stops
from rlreason.model import transformer
from rlreason.sampling.draw import row_keys
from rlreason.sampling.draw import step_keys


def _batch(x, mesh):
  """[N, ...] constrained to the rollout batch sharding (no-op: no mesh)."""
  return engine.constrain(x, ("batch",) + (None,) * (x.ndim - 1), mesh)


@functools.partial(
  jax.jit, static_argnames=("model_cfg", "n", "length", "mesh")
)
def init_cache(model_cfg, n, length, *, mesh=None) -> transformer.Cache:
  """An empty cache of `length` slots for n rows, made in place: with a
  mesh, each device allocates only its rows."""
  if model_cfg.decode_attention != "dense":
    # Appended segments leave padding between a row's real slots.
    raise ValueError(
      f"decode_attention={model_cfg.decode_attention!r}: the multi-turn "
      "and tree samplers decode with dense attention"
    )
  return engine.constrain_cache(
    transformer.init_cache(model_cfg, n, length), mesh
  )


@functools.partial(jax.jit, static_argnames=("model_cfg", "mesh"))
def extend(params, cache, tokens, positions, *, model_cfg, mesh=None):
  """Writes tokens [N, Q] (left padded) into the cache.

  Returns the logits [N, V] after the last column (the next token's
  distribution for rows whose last column is real) and the cache.
  """
  params = transformer.compute_params(params, model_cfg)
  hidden, cache = transformer.hidden_states(
    params, _batch(tokens, mesh), _batch(positions, mesh), model_cfg, cache
  )
  logits = transformer.unembed(params, hidden[:, -1], model_cfg)
  return engine.batch_logits(logits, mesh), engine.constrain_cache(cache, mesh)


@jax.jit
def rewind(cache, from_pos) -> transformer.Cache:
  """Hides every slot of row n whose position is >= from_pos[n] [N].

  Positions within a row are distinct, so this forgets exactly the tokens
  fed at those positions; later writes go to fresh slots (the write index
  does not move back).
  """
  hidden = cache.pos >= from_pos[:, None]
  return cache._replace(pos=jnp.where(hidden, -1, cache.pos))


class Segment(NamedTuple):
  """One turn of `decode`: tokens, logp, policy_logp, entropy [N, Tt];
  lengths [N]; stopped [N] (ended on a stop id or stop sequence)."""

  tokens: jax.Array
  logp: jax.Array
  policy_logp: jax.Array
  entropy: jax.Array
  lengths: jax.Array
  stopped: jax.Array


class _Carry(NamedTuple):
  step: jax.Array  # [] tokens drawn so far
  done: jax.Array  # [N]
  lengths: jax.Array  # [N]
  last: jax.Array  # [N] the last drawn token
  tokens: jax.Array  # [N, Tt]
  logp: jax.Array
  policy_logp: jax.Array
  entropy: jax.Array
  window: jax.Array | None  # [N, k - 1] for stop sequences (stops.py)
  cache: transformer.Cache


@functools.partial(
  jax.jit,
  static_argnames=(
    "model_cfg",
    "max_new_tokens",
    "sampling",
    "stop_ids",
    "pad_id",
    "stop_sequences",
    "mesh",
  ),
)
def decode(
  params,
  cache,
  logits,
  start_pos,
  active,
  rng,
  row_offset=0,
  *,
  model_cfg,
  max_new_tokens,
  sampling,
  stop_ids,
  pad_id,
  stop_sequences=(),
  mesh=None,
) -> tuple[Segment, transformer.Cache]:
  """Samples up to max_new_tokens tokens per active row, from `logits`.

  Token j of row n has position start_pos[n] + j. Unlike sampling.sample,
  a row's last token (its stop token, or token Tt - 1) is never fed to the
  model: the caller feeds it in front of the next observation (`extend`).
  Row n's step j draws with fold_in(fold_in(rng, row_offset + n), j), as
  in sampling.sample (sampling.row_keys): rows decoded in several calls
  draw as in one.

  Args:
    params, cache: the model and its cache (already holding the context).
    logits: [N, V] distribution of token 0.
    start_pos: [N] int32 position of token 0.
    active: [N] bool; inactive rows sample nothing (length 0).
    rng: a key.
    row_offset: the batch index of row 0 (a call of a chunked batch).
    model_cfg, max_new_tokens, sampling, stop_ids, pad_id: static.
    stop_sequences: static tuple of id tuples (>= 2 ids each, see
      stops.split) that end a row when its last tokens equal one.
    mesh: constrain rows to the rollout batch sharding (static).

  Returns:
    (Segment, cache).
  """
  n, t_max = logits.shape[0], max_new_tokens
  cparams = transformer.compute_params(params, model_cfg)
  batch = lambda x: _batch(x, mesh)
  stop_ids, stop_sequences = stops.split(stop_ids, stop_sequences)
  start_pos = batch(start_pos)
  keys = batch(row_keys(rng, n, row_offset))

  def record(c: _Carry, logits) -> _Carry:
    new, lp, plp = sampling.draw(logits, step_keys(keys, c.step))
    h = policy.entropy(logits)  # of the untempered policy
    alive = ~c.done
    new = jnp.where(alive, new, pad_id)
    hit, window = stops.check(new, c.window, stop_ids, stop_sequences)
    col = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
      buf, jnp.where(alive, x, 0).astype(buf.dtype)[:, None], c.step, axis=1
    )
    return c._replace(
      step=c.step + 1,
      done=c.done | (alive & hit),
      lengths=c.lengths + alive.astype(jnp.int32),
      last=new,
      tokens=jax.lax.dynamic_update_slice_in_dim(
        c.tokens, new[:, None], c.step, axis=1
      ),
      logp=col(c.logp, lp),
      policy_logp=col(c.policy_logp, plp),
      entropy=col(c.entropy, h),
      window=window,
    )

  z = lambda dt: batch(jnp.zeros((n, t_max), dt))
  carry = _Carry(
    step=jnp.zeros((), jnp.int32),
    done=batch(~active),
    lengths=batch(jnp.zeros((n,), jnp.int32)),
    last=batch(jnp.zeros((n,), jnp.int32)),
    tokens=batch(jnp.full((n, t_max), pad_id, jnp.int32)),
    logp=z(jnp.float32),
    policy_logp=z(jnp.float32),
    entropy=z(jnp.float32),
    window=jax.tree.map(batch, stops.init_window(n, stop_sequences)),
    cache=engine.constrain_cache(cache, mesh),
  )
  carry = record(carry, batch(logits))

  def cond(c: _Carry):
    return (c.step < t_max) & ~jnp.all(c.done)

  def body(c: _Carry):
    # Only rows still sampling feed their last token (position j - 1).
    pos = jnp.where(c.done, -1, start_pos + c.step - 1)
    hidden, cache = transformer.hidden_states(
      cparams, c.last[:, None], pos[:, None], model_cfg, c.cache
    )
    logits = transformer.unembed(cparams, hidden[:, -1], model_cfg)
    return record(
      c._replace(cache=engine.constrain_cache(cache, mesh)),
      engine.batch_logits(logits, mesh),
    )

  c = jax.lax.while_loop(cond, body, carry)
  stopped = c.done & active
  seg = Segment(c.tokens, c.logp, c.policy_logp, c.entropy, c.lengths, stopped)
  return seg, c.cache
