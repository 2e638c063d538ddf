"""The policy as pure functions of params: logits, token log-probs, entropy.

Shapes: N sequences, S tokens, P prompt length, T = S - P completion length,
V vocab. Prompts are left padded; padding has position -1 (see
model/transformer.py).

`completion_logprobs` holds at most LOGITS_CHUNK_BYTES of logits: above
that it scores the completion in chunks of tokens under remat
(the peak is one [N, chunk, V] block, in the forward and the backward
pass), with the same numbers as one block. What else a loss needs from the
whole distribution (a nucleus entropy, a proxy's log-prob) is a `per_token`
function of each block, computed the same way. The jitted
functions are keyed on the active activation mesh (mesh.activation_mesh),
so a trace with sharding constraints is never reused without them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rlreason import devices
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
# A per_token function's intermediate tagged with this name
# (jax.ad_checkpoint.checkpoint_name) is kept by the chunks' remat instead
# of recomputed in the backward pass: small [N, chunk] values that cost
# many passes over the block (entropy_reg's nucleus threshold).
SAVED = "per_token_saved"


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
  per_token: tuple = (),
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
    per_token: functions f(z, targets) -> [...] of the scored logits z =
      logits / temperature (float32 [..., V]) and the completion tokens
      [...], for losses that need the whole distribution (entropy_reg.py),
      computed block by block as logp is. Each reduces over V only (and
      picks targets by masked sums, not gathers: V may be split over
      devices). Hashable (a jit static argument): inside a jitted loss any
      function will do; called outside one, pass the same objects each
      time or each call compiles anew.

  Returns:
    logp [N, T] with logp[:, t] = log pi(tokens[:, P + t] | tokens[:, :P + t]),
    then entropy [N, T] if asked, then one [N, T] per `per_token` function:
    a tuple when more than logp is asked for.
  """
  n, t = tokens.shape[0], tokens.shape[1] - prompt_len
  return _completion_logprobs(
    params,
    tokens,
    positions,
    model_cfg,
    prompt_len,
    temperature=temperature,
    with_entropy=with_entropy,
    per_token=tuple(per_token),
    chunk=logits_chunk(n, t, model_cfg.vocab_size),
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


@devices.options_jit(  # under devices.compile_options: --score_temp_budget_mib
  static_argnames=(
    "model_cfg",
    "prompt_len",
    "with_entropy",
    "per_token",
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
  per_token,
  chunk,
  act_mesh,
):
  with mesh_lib.activation_mesh(act_mesh):
    hidden, _ = transformer.hidden_states(params, tokens, positions, model_cfg)
    # Only positions P-1 .. S-2 predict completion tokens: skip the vocab
    # projection everywhere else.
    hidden = hidden[:, prompt_len - 1 : -1]
    targets = tokens[:, prompt_len:]
    score = functools.partial(
      _block_scores,
      temperature=temperature,
      with_entropy=with_entropy,
      per_token=per_token,
    )
    if chunk is not None:
      out = _chunked_scores(params, hidden, targets, model_cfg, score, chunk)
    else:
      out = score(transformer.unembed(params, hidden, model_cfg), targets)
    return out if len(out) > 1 else out[0]


def _block_scores(
  block, targets, *, temperature, with_entropy, per_token, onehot=False
):
  """(logp, [entropy], *per_token) of a block of logits [N, c, V]."""
  out = (log_softmax_at(block, targets, temperature, onehot=onehot),)
  if with_entropy:
    out += (entropy(block, temperature),)
  if per_token:
    z = block.astype(jnp.float32) / temperature
    out += tuple(f(z, targets) for f in per_token)
  return out


def _chunked_scores(params, hidden, targets, model_cfg, score, chunk):
  """`score`'s (_block_scores') [N, T] outputs from hidden [N, T, D],
  `chunk` tokens at a time: a scan whose rematerialised body holds one
  [N, chunk, V] block (and keeps what per_token tags SAVED)."""
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

  @functools.partial(
    jax.checkpoint,
    policy=jax.checkpoint_policies.save_only_these_names(SAVED),
  )
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
    return carry, score(block, y, onehot=bool(split))

  _, outs = jax.lax.scan(body, None, (hs, ys))
  return tuple(o.swapaxes(0, 1).reshape(n, c * chunk)[:, :t] for o in outs)
