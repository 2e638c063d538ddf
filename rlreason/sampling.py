"""Autoregressive sampling with an explicit KV cache: prefill + while_loop.

  out = sampling.sample(params, tokens, positions, rng, model_cfg=model_cfg,
                        max_new_tokens=256, sampling=Sampling(top_p=0.95),
                        stop_ids=(tok.eos_id,), pad_id=tok.pad_id)

One jitted call runs a prefill over the (left-padded) prompts, then a
`lax.while_loop` that feeds one token per step through fixed-size cache
buffers. The loop stops after `max_new_tokens` steps or as soon as every row
has emitted a stop token (gemma `_sampler_loop.py`). Every static choice
(model, sampling filters, stop ids, T) is a hashable jit argument, so calls
with the same shapes never recompile.

Shapes: N sequences, P prompt length (left padded; positions count from 0
at the first real token, -1 on padding), T = max_new_tokens completion
length, S = P + T - 1 cache length, V vocab.

Mask convention: mask = 1 for completion tokens up to and including the stop
token, 0 after it. Tokens after the stop token are `pad_id`, with logp 0.
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig

# Finish reasons, as stored in `SampleOutput.finish` (index into the names).
FINISH_LENGTH = 0  # hit max_new_tokens
FINISH_EOS = 1  # emitted EOS or another stop id
FINISH_REASONS = ("length", "eos")


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a token is drawn from the logits of one step (hashable, static).

  The filters apply in the order of HF `generate` and vLLM: temperature,
  then top-k, then top-p on the renormalised top-k distribution, then min-p.
  A filter at its neutral value (top_k=0, top_p=1, min_p=0) is skipped at
  trace time, so the default costs no sort.

  Attributes:
    temperature: logits are divided by it; 0 means greedy (argmax).
    top_k: keep the k most likely tokens (0 = off). Ties with the k-th
      value are kept too.
    top_p: keep the smallest set of most likely tokens whose probability
      reaches top_p (nucleus sampling, arXiv:1904.09751); 1 = off.
    min_p: keep tokens with p >= min_p * max p (arXiv:2407.01082); 0 = off.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(
        f"temperature={self.temperature} must be >= 0 (0 means greedy)"
      )
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r} must be an int >= 0 (0 = off)")
    if not 0 <= self.min_p < 1:
      raise ValueError(f"min_p={self.min_p} must be in [0, 1)")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  @property
  def is_policy(self) -> bool:
    """True when samples come from the untempered, unfiltered policy."""
    return (
      self.temperature == 1
      and self.top_k == 0
      and self.top_p == 1
      and self.min_p == 0
    )

  def sampling_logits(self, logits: jax.Array) -> jax.Array:
    """Logits of the distribution actually sampled from.

    Args:
      logits: [N, V] model logits.

    Returns:
      [N, V] fp32: logits / temperature, -inf on filtered-out tokens; for
      greedy, 0 at the (first) argmax and -inf elsewhere.
    """
    logits = logits.astype(jnp.float32)
    if self.greedy:
      ids = jnp.arange(logits.shape[-1])[None, :]
      return jnp.where(ids == argmax(logits)[:, None], 0.0, -jnp.inf)
    z = logits if self.temperature == 1 else logits / self.temperature
    v = z.shape[-1]
    top_k = self.top_k if 0 < self.top_k < v else 0
    threshold = None  # keep z >= threshold, [N, 1]
    if top_k:
      vals = jax.lax.top_k(z, top_k)[0]  # [N, k], descending
      threshold = vals[:, -1:]
      if self.top_p < 1:
        # Nucleus of the renormalised top-k: keep a token if the mass
        # strictly before it is < top_p (the smallest prefix reaching it).
        probs = jax.nn.softmax(vals, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.where(before < self.top_p, vals, jnp.inf)
        threshold = jnp.min(kept, axis=-1, keepdims=True)
    elif self.top_p < 1:
      # A full-vocab sort is very slow on CPU: bisect for the threshold.
      threshold = _nucleus_threshold(z, self.top_p)
    if self.min_p > 0:
      # p / max p = exp(z - max z), whatever the normaliser.
      floor = jnp.max(z, axis=-1, keepdims=True) + np.log(self.min_p)
      threshold = floor if threshold is None else jnp.maximum(threshold, floor)
    if threshold is None:
      return z
    return jnp.where(z >= threshold, z, -jnp.inf)

  def draw(
    self, logits: jax.Array, rng: jax.Array
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws one token per row.

    Args:
      logits: [N, V] model logits.
      rng: a key.

    Returns:
      tokens [N] int32; logp [N], the log-prob of each token under the
      sampling distribution (0 for greedy); policy_logp [N], its log-prob
      under the untempered policy, log softmax(logits).
    """
    logits = logits.astype(jnp.float32)
    if self.greedy:
      tokens = argmax(logits)
      return (
        tokens,
        jnp.zeros(tokens.shape, jnp.float32),
        _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1),
      )
    z = self.sampling_logits(logits)
    z_max = jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z - z_max)  # [N, V], 0 where filtered
    tokens, total = inverse_cdf(e, jax.random.uniform(rng, e.shape[:1]))
    logp = _take(z, tokens) - z_max[:, 0] - jnp.log(total)
    if self.is_policy:
      return tokens, logp, logp
    policy_logp = _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
    return tokens, logp, policy_logp


# --- Vocab-sized primitives ---------------------------------------------------
# XLA:CPU is slow at argmax (a variadic reduce), cumsum over long axes and
# sorts, and threefry bits for every vocab entry (jax.random.categorical)
# cost more than the model's decode step. So: two-level scans over blocks of
# the vocab, and one uniform per row.


def _take(x: jax.Array, ids: jax.Array) -> jax.Array:
  """x [N, V], ids [N] -> x[n, ids[n]] [N]."""
  return jnp.take_along_axis(x, ids[:, None], axis=-1)[:, 0]


def _block_size(v: int) -> int:
  """A power of two near sqrt(V), so both levels scan ~sqrt(V) entries."""
  return 1 << max(3, math.ceil(math.log2(v) / 2))


def _blocked(x: jax.Array, fill: float) -> jax.Array:
  """[N, V] -> [N, V / B, B], padded with `fill`."""
  n, v = x.shape
  b = _block_size(v)
  nb = -(-v // b)
  if nb * b != v:
    x = jnp.pad(x, ((0, 0), (0, nb * b - v)), constant_values=fill)
  return x.reshape(n, nb, b)


def _first(cond: jax.Array) -> jax.Array:
  """[N, M] bool -> [N] index of the first True (M if none)."""
  m = cond.shape[-1]
  iota = jnp.arange(m, dtype=jnp.float32)[None, :]
  return jnp.min(jnp.where(cond, iota, float(m)), axis=-1).astype(jnp.int32)


def _last(cond: jax.Array) -> jax.Array:
  """[N, M] bool -> [N] index of the last True (0 if none)."""
  iota = jnp.arange(cond.shape[-1], dtype=jnp.float32)[None, :]
  return jnp.max(jnp.where(cond, iota, 0.0), axis=-1).astype(jnp.int32)


def argmax(logits: jax.Array) -> jax.Array:
  """[N, V] -> [N] int32 index of the first maximum (== jnp.argmax)."""
  x = _blocked(logits, -jnp.inf)  # [N, NB, B]
  block_max = jnp.max(x, axis=-1)  # [N, NB]
  best = jnp.max(block_max, axis=-1, keepdims=True)  # [N, 1]
  block = _first(block_max == best)
  inner = jnp.take_along_axis(x, block[:, None, None], axis=1)[:, 0]
  return block * x.shape[-1] + _first(inner == best)


def inverse_cdf(e: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Index i with probability e_i / sum(e), by inverting the CDF at u.

  Two levels: choose a block of the vocab from the block masses, then a
  token inside it. Entries with e_i = 0 are never chosen.

  Args:
    e: [N, V] unnormalised probabilities, >= 0, some > 0 in every row.
    u: [N] uniform in [0, 1).

  Returns:
    index [N] int32, and the total mass sum(e) [N].
  """
  x = _blocked(e, 0.0)  # [N, NB, B]
  mass = jnp.sum(x, axis=-1)  # [N, NB]
  cum = jnp.cumsum(mass, axis=-1)
  total = cum[:, -1]
  target = (u * total)[:, None]  # [N, 1]
  # The first block whose cumulative mass passes the target; rounding can
  # leave none, then the last block with mass.
  block = jnp.minimum(_first((cum > target) & (mass > 0)), _last(mass > 0))
  inner = jnp.take_along_axis(x, block[:, None, None], axis=1)[:, 0]
  before = _take(cum - mass, block)[:, None]  # [N, 1]
  inner_cum = before + jnp.cumsum(inner, axis=-1)  # [N, B]
  index = jnp.minimum(
    _first((inner_cum > target) & (inner > 0)), _last(inner > 0)
  )
  return block * x.shape[-1] + index, total


def _nucleus_threshold(z: jax.Array, top_p: float) -> jax.Array:
  """Smallest kept logit of the top-p nucleus of softmax(z), by bisection.

  Finds the largest t among the values of z with mass(z >= t) >= top_p:
  32 masked sums over [N, V] on the monotone uint32 image of the floats,
  exact (ties kept), and much cheaper than a sort on CPU.

  Args:
    z: [N, V] fp32 logits (finite or -inf).
    top_p: in (0, 1).

  Returns:
    [N, 1] threshold: keep z >= threshold.
  """
  e = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))
  goal = top_p * jnp.sum(e, axis=-1, keepdims=True)  # [N, 1]
  bits = jax.lax.bitcast_convert_type(z, jnp.uint32)
  # Order-preserving map of floats to uint32: flip all bits of negatives,
  # only the sign bit of positives.
  neg = bits >= jnp.uint32(1 << 31)
  key = jnp.where(neg, ~bits, bits | jnp.uint32(1 << 31))
  lo = jnp.min(key, axis=-1, keepdims=True)  # mass(z >= lo) = 1 >= top_p
  hi = jnp.max(key, axis=-1, keepdims=True)

  def body(_, bounds):  # invariant: answer in [lo, hi]
    lo, hi = bounds
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # upper middle: no overflow
    ok = jnp.sum(jnp.where(key >= mid, e, 0.0), axis=-1, keepdims=True) >= goal
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))
  # Back from the key to the float.
  neg = lo < jnp.uint32(1 << 31)
  bits = jnp.where(neg, ~lo, lo & jnp.uint32((1 << 31) - 1))
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


@flax.struct.dataclass
class SampleState:
  """Carry of the decode loop.

  Attributes:
    step: [] number of tokens sampled so far (the next buffer column).
    done: [N] the row has emitted a stop token.
    lengths: [N] completion tokens so far, the stop token included.
    last_token: [N] the last sampled token, input of the next forward.
    last_pos: [N] its position (-1 once the row is done: it is padding).
    tokens: [N, T] sampled tokens; pad_id after the stop token.
    logp: [N, T] log-prob under the sampling distribution; 0 after stop.
    policy_logp: [N, T] log-prob under the untempered policy; 0 after stop.
    cache: the KV cache, S = P + T - 1 slots.
    rng: the key of this sampling call; step t draws with fold_in(rng, t).
    logits: [N, T, V] model logits of every step, or None (not recorded).
  """

  step: jax.Array
  done: jax.Array
  lengths: jax.Array
  last_token: jax.Array
  last_pos: jax.Array
  tokens: jax.Array
  logp: jax.Array
  policy_logp: jax.Array
  cache: transformer.Cache
  rng: jax.Array
  logits: jax.Array | None


class SampleOutput(NamedTuple):
  """Result of `sample`. Arrays on device.

  Attributes:
    tokens: [N, T] completion tokens, pad_id after the stop token.
    logp: [N, T] log-prob of each token under the sampling distribution
      (temperature and filters applied; 0 for greedy and after the stop).
    policy_logp: [N, T] log-prob under the untempered policy.
    mask: [N, T] int32, 1 up to and including the stop token.
    lengths: [N] int32, completion length (mask.sum(-1)).
    finish: [N] int32, FINISH_EOS or FINISH_LENGTH.
    logits: [N, T, V] fp32 model logits of every step (None unless asked).
  """

  tokens: jax.Array
  logp: jax.Array
  policy_logp: jax.Array
  mask: jax.Array
  lengths: jax.Array
  finish: jax.Array
  logits: jax.Array | None = None


def sample(
  params: Any,
  tokens: jax.Array,
  positions: jax.Array,
  rng: jax.Array,
  *,
  model_cfg: ModelConfig,
  max_new_tokens: int,
  sampling: Sampling = Sampling(),
  stop_ids: tuple[int, ...] = (),
  pad_id: int = 0,
  return_logits: bool = False,
  mesh: jax.sharding.Mesh | None = None,
) -> SampleOutput:
  """Samples up to `max_new_tokens` tokens after each (left-padded) prompt.

  Args:
    params: model parameters (any sharding; decoding is fastest in the
      mesh.ROLLOUT_RULES layout, see rollout.py).
    tokens: [N, P] int32 prompts, left padded.
    positions: [N, P] int32, 0.. from the first real token, -1 on padding.
      The last column must be a real token (every prompt non-empty).
    rng: a key; the same key gives the same samples.
    model_cfg: the architecture (static).
    max_new_tokens: T (static).
    sampling: temperature and filters (static).
    stop_ids: token ids that end a row (EOS and extra stops), static.
    pad_id: written after the stop token.
    return_logits: also return the [N, T, V] logits of every step (tests).
    mesh: constrain the cache and loop buffers to the rollout batch
      sharding on this mesh (None: let XLA propagate the inputs').

  Returns:
    A SampleOutput.
  """
  stop_ids = tuple(int(i) for i in stop_ids)
  _check_inputs(
    tokens, positions, model_cfg, max_new_tokens, sampling, stop_ids, pad_id
  )
  return _sample(
    params,
    tokens,
    positions,
    rng,
    model_cfg=model_cfg,
    max_new_tokens=int(max_new_tokens),
    sampling=sampling,
    stop_ids=stop_ids,
    pad_id=int(pad_id),
    return_logits=return_logits,
    mesh=mesh,
  )


def cache_size() -> int:
  """How many sampler variants are compiled in this process.

  Calls with the same shapes and static arguments must not add one (tested).
  """
  return _sample._cache_size()  # pylint: disable=protected-access


def _check_inputs(
  tokens, positions, model_cfg, max_new_tokens, sampling, stop_ids, pad_id
):
  """Raises ValueError on bad arguments, before anything is compiled."""
  if not isinstance(sampling, Sampling):
    raise TypeError(
      f"sampling must be a sampling.Sampling, got {type(sampling).__name__}"
    )
  if tokens.ndim != 2 or tokens.shape != positions.shape:
    raise ValueError(
      f"tokens {tokens.shape} and positions {positions.shape} "
      "must both be [N, P]"
    )
  if tokens.shape[0] == 0 or tokens.shape[1] == 0:
    raise ValueError(f"Empty prompt batch: tokens have shape {tokens.shape}")
  if not (
    isinstance(max_new_tokens, (int, np.integer)) and max_new_tokens >= 1
  ):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  v = model_cfg.vocab_size
  bad = [i for i in stop_ids if not 0 <= i < v]
  if bad:
    raise ValueError(f"stop ids {bad} are outside the vocabulary [0, {v})")
  if not 0 <= pad_id < v:
    raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {v})")
  if isinstance(positions, np.ndarray) and (positions[:, -1] < 0).any():
    rows = np.flatnonzero(positions[:, -1] < 0)[:5].tolist()
    raise ValueError(
      f"Rows {rows} end with padding: prompts must be left padded and non-empty"
    )


# Logical axes of a cache k / v buffer (the model's layout).
_KV_AXES = transformer.CACHE_AXES


def _constrain(x: jax.Array, axes: tuple, mesh) -> jax.Array:
  if mesh is None:
    return x
  spec = mesh_lib.spec(axes, mesh_lib.ROLLOUT_RULES, x.shape, mesh)
  return jax.lax.with_sharding_constraint(
    x, jax.sharding.NamedSharding(mesh, spec)
  )


def _constrain_cache(cache: transformer.Cache, mesh) -> transformer.Cache:
  if mesh is None:
    return cache
  return transformer.Cache(
    k=tuple(_constrain(k, _KV_AXES, mesh) for k in cache.k),
    v=tuple(_constrain(v, _KV_AXES, mesh) for v in cache.v),
    pos=_constrain(cache.pos, ("batch", "seq"), mesh),
    index=cache.index,
  )


@functools.partial(
  jax.jit,
  static_argnames=(
    "model_cfg",
    "max_new_tokens",
    "sampling",
    "stop_ids",
    "pad_id",
    "return_logits",
    "mesh",
  ),
)
def _sample(
  params,
  tokens,
  positions,
  rng,
  *,
  model_cfg,
  max_new_tokens,
  sampling,
  stop_ids,
  pad_id,
  return_logits,
  mesh,
) -> SampleOutput:
  n, p = tokens.shape
  t_max = max_new_tokens
  # Weights cast to the compute dtype once, before the loop, not on every
  # decode step: a bf16 rollout of fp32 master weights reads half the bytes
  # per token (decode is memory-bound), with the same numerics (the model
  # casts each weight to the compute dtype before its matmul anyway).
  dt = model_cfg.compute_dtype
  params = jax.tree.map(
    lambda w: w.astype(dt) if jnp.issubdtype(w.dtype, jnp.floating) else w,
    params,
  )
  batch = lambda x: _constrain(x, ("batch",) + (None,) * (x.ndim - 1), mesh)
  tokens = batch(tokens.astype(jnp.int32))
  positions = batch(positions.astype(jnp.int32))
  stop = jnp.asarray(stop_ids, jnp.int32)

  def is_stop(tok):  # [N] -> [N] bool
    if not stop_ids:
      return jnp.zeros(tok.shape, bool)
    return jnp.any(tok[:, None] == stop[None, :], axis=-1)

  def forward(tok, pos, cache):  # [N, Q] -> last logits [N, V], cache
    hidden, cache = transformer.hidden_states(
      params, tok, pos, model_cfg, cache
    )
    logits = transformer.unembed(params, hidden[:, -1], model_cfg)
    return batch(logits), _constrain_cache(cache, mesh)

  def record(state: SampleState, logits) -> SampleState:
    """Draws token `step` from `logits` [N, V] and writes the buffers."""
    tok, logp, policy_logp = sampling.draw(
      logits, jax.random.fold_in(state.rng, state.step)
    )
    alive = ~state.done
    tok = jnp.where(alive, tok, pad_id)
    zero = jnp.zeros_like(logp)
    col = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
      buf, x[:, None].astype(buf.dtype), state.step, axis=1
    )
    all_logits = state.logits
    if all_logits is not None:
      all_logits = jax.lax.dynamic_update_slice_in_dim(
        all_logits, logits[:, None], state.step, axis=1
      )
    return state.replace(
      step=state.step + 1,
      done=state.done | (alive & is_stop(tok)),
      lengths=state.lengths + alive.astype(jnp.int32),
      last_token=tok,
      # The next input's position; a finished row feeds padding.
      last_pos=jnp.where(alive, state.last_pos + 1, -1),
      tokens=col(state.tokens, tok),
      logp=col(state.logp, jnp.where(alive, logp, zero)),
      policy_logp=col(state.policy_logp, jnp.where(alive, policy_logp, zero)),
      logits=all_logits,
    )

  # Prefill: the whole prompt in one call; its last logits give token 0.
  cache = _constrain_cache(
    transformer.init_cache(model_cfg, n, p + t_max - 1), mesh
  )
  logits, cache = forward(tokens, positions, cache)
  zeros = lambda dtype: batch(jnp.zeros((n, t_max), dtype))
  state = SampleState(
    step=jnp.zeros((), jnp.int32),
    done=batch(jnp.zeros((n,), bool)),
    lengths=batch(jnp.zeros((n,), jnp.int32)),
    last_token=tokens[:, -1],
    last_pos=positions[:, -1],
    tokens=batch(jnp.full((n, t_max), pad_id, jnp.int32)),
    logp=zeros(jnp.float32),
    policy_logp=zeros(jnp.float32),
    cache=cache,
    rng=rng,
    logits=(
      batch(jnp.zeros((n, t_max, model_cfg.vocab_size), jnp.float32))
      if return_logits
      else None
    ),
  )
  state = record(state, logits)

  def cond(state: SampleState):
    return (state.step < t_max) & ~jnp.all(state.done)

  def body(state: SampleState):
    logits, cache = forward(
      state.last_token[:, None], state.last_pos[:, None], state.cache
    )
    return record(state.replace(cache=cache), logits)

  state = jax.lax.while_loop(cond, body, state)
  mask = (jnp.arange(t_max)[None, :] < state.lengths[:, None]).astype(jnp.int32)
  finish = jnp.where(state.done, FINISH_EOS, FINISH_LENGTH).astype(jnp.int32)
  return SampleOutput(
    tokens=state.tokens,
    logp=state.logp,
    policy_logp=state.policy_logp,
    mask=mask,
    lengths=state.lengths,
    finish=finish,
    logits=state.logits,
  )
