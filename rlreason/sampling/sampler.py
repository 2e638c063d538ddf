"""Autoregressive sampling with an explicit KV cache: prefill + while_loop.

  out = sampling.sample(params, tokens, positions, rng, model_cfg=model_cfg,
                        max_new_tokens=256, sampling=Sampling(top_p=0.95),
                        stop_ids=(tok.eos_id,), pad_id=tok.pad_id,
                        stop_sequences=((tag_a, tag_b, tag_c),))

One jitted call runs a prefill over the (left-padded) prompts, then a
`lax.while_loop` that feeds one token per step through fixed-size cache
buffers. The loop stops after `max_new_tokens` steps or as soon as every row
has emitted a stop (gemma `_sampler_loop.py`): a stop id, or a multi-token
stop sequence that its last emitted tokens equal (stops.py: a rolling
window of the last k - 1 tokens in the loop carry). Every static choice
(model, sampling filters, stop ids and sequences, T) is a hashable jit
argument, so calls with the same shapes never recompile. Each step draws
its tokens with draw.py (`Sampling.draw`, one key per row: `row_keys`,
`step_keys`).

Shapes: N sequences, P prompt length (left padded; positions count from 0
at the first real token, -1 on padding), T = max_new_tokens completion
length, S = P + T - 1 cache length, V vocab.

Mask convention: mask = 1 for completion tokens up to and including the stop
token (all tokens of a stop sequence), 0 after it. Tokens after the stop are
`pad_id`, with logp 0.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from rlreason.sampling import engine
from rlreason.sampling import stops
from rlreason.model import attention_kernels
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig
from rlreason.sampling.draw import Sampling
from rlreason.sampling.draw import row_keys
from rlreason.sampling.draw import step_keys

# Finish reasons, as stored in `SampleOutput.finish` (index into the names).
FINISH_LENGTH = 0  # hit max_new_tokens
FINISH_EOS = 1  # emitted EOS, another stop id, or a stop sequence
FINISH_REASONS = ("length", "eos")


@flax.struct.dataclass
class SampleState:
  """Carry of the decode loop.

  Attributes:
    step: [] number of tokens sampled so far (the next buffer column).
    done: [N] the row has emitted a stop id or ended a stop sequence.
    lengths: [N] completion tokens so far, the stop token included.
    last_token: [N] the last sampled token, input of the next forward.
    last_pos: [N] its position (-1 once the row is done: it is padding).
    tokens: [N, T] sampled tokens; pad_id after the stop token.
    logp: [N, T] log-prob under the sampling distribution; 0 after stop.
    policy_logp: [N, T] log-prob under the untempered policy; 0 after stop.
    cache: the KV cache, S = P + T - 1 slots.
    rng: [N] keys, one per row (row_keys); step t draws with their
      fold_in(., t).
    logits: [N, T, V] model logits of every step, or None (not recorded).
    window: [N, k - 1] the last emitted tokens, -1 before the first
      (stops.check), or None without multi-token stop sequences.
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
  window: jax.Array | None = None


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
  sampling: Sampling = Sampling(),  # noqa: B008 - a frozen dataclass
  stop_ids: tuple[int, ...] = (),
  pad_id: int = 0,
  return_logits: bool = False,
  mesh: jax.sharding.Mesh | None = None,
  stop_sequences: tuple[tuple[int, ...], ...] = (),
  row_offset: int = 0,
  row_limits: jax.Array | None = None,
  compiler_options: dict | None = None,
  progress: Callable[[int], None] | None = None,
) -> SampleOutput:
  """Samples up to `max_new_tokens` tokens after each (left-padded) prompt.

  Args:
    params: model parameters (any sharding; decoding is fastest in the
      mesh.ROLLOUT_RULES layout, see rollout.py).
    tokens: [N, P] int32 prompts, left padded.
    positions: [N, P] int32, 0.. from the first real token, -1 on padding.
      The last column must be a real token (every prompt non-empty).
    rng: a key; the same key gives the same samples. Row i draws with its
      own key, fold_in(rng, row_offset + i) (row_keys), so its tokens depend
      on its prompt, rng and global row index only, not on the other rows:
      a batch sampled in chunks (each with its offset) gives the tokens of
      one call, up to the numerics of the model's batched forward.
    model_cfg: the architecture (static).
    max_new_tokens: T (static).
    sampling: temperature and filters (static).
    stop_ids: token ids that end a row (EOS and extra stops), static.
    pad_id: written after the stop token.
    return_logits: also return the [N, T, V] logits of every step (tests).
    mesh: constrain the cache and loop buffers to the rollout batch
      sharding on this mesh (None: let XLA propagate the inputs').
    stop_sequences: token-id sequences that end a row once its last emitted
      tokens equal one (e.g. a multi-token "</search>"; see
      stops.token_sequences for strings), static. Length-1 sequences join
      stop_ids.
    row_offset: the global index of row 0 (see rng).
    row_limits: [N] int32 in [1, T], each row's own token budget (it ends
      with finish "length" there), or None: T for every row.
    compiler_options: the jitted loop's compile options, e.g. libtpu's
      temporaries budget (train_step.compiler_options); None: defaults.
    progress: called with the number of rows finished each time the loop
      has drawn another engine.PROGRESS_STEPS tokens and rows are left,
      from inside the one compiled loop (engine.report: the same program,
      and per-chip bytes, as without, which host calls of that many steps
      would not keep: plan_results/NOTES.md, session 78); the call then
      waits for its outputs. Ignored where T is no more than that, and on
      GPUs (engine.progress_every).

  Returns:
    A SampleOutput.
  """
  stop_ids, stop_sequences = engine.check_inputs(
    tokens,
    positions,
    model_cfg,
    max_new_tokens,
    sampling,
    stop_ids,
    stop_sequences,
    pad_id,
    row_limits,
  )
  every = engine.progress_every(progress)
  if max_new_tokens <= every:
    every = 0  # the loop ends before a report
  fn = engine.jitted(_sample, compiler_options, **_SAMPLE_JIT)
  return engine.reporting(
    progress if every else None,
    lambda: fn(
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
      stop_sequences=stop_sequences,
      row_offset=row_offset,
      row_limits=row_limits,
      progress_every=every,
    ),
  )


def cache_size() -> int:
  """How many sampler variants are compiled in this process.

  Calls with the same shapes and static arguments must not add one (tested).
  """
  return _sample._cache_size()  # pylint: disable=protected-access


_SAMPLE_STATIC = (
  "model_cfg",
  "max_new_tokens",
  "sampling",
  "stop_ids",
  "pad_id",
  "return_logits",
  "mesh",
  "stop_sequences",
  "progress_every",
)
_SAMPLE_JIT = dict(static_argnames=_SAMPLE_STATIC)


@functools.partial(jax.jit, **_SAMPLE_JIT)
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
  stop_sequences=(),
  row_offset=0,
  row_limits=None,
  progress_every=0,
) -> SampleOutput:
  n, p = tokens.shape
  t_max = max_new_tokens
  params = transformer.compute_params(params, model_cfg)
  batch = lambda x: engine.constrain(
    x, ("batch",) + (None,) * (x.ndim - 1), mesh
  )
  tokens = batch(tokens.astype(jnp.int32))
  positions = batch(positions.astype(jnp.int32))
  # A row is live until it stops or reaches its own budget.
  limit = t_max if row_limits is None else batch(row_limits.astype(jnp.int32))
  live = lambda state: ~state.done & (state.lengths < limit)

  def forward(tok, pos, cache):  # [N, Q] -> last logits [N, V], cache
    return engine.last_logits(params, tok, pos, cache, model_cfg, mesh)

  def record(state: SampleState, logits) -> SampleState:
    """Draws token `step` from `logits` [N, V] and writes the buffers."""
    tok, logp, policy_logp = sampling.draw(
      logits, step_keys(state.rng, state.step)
    )
    alive = live(state)
    tok = jnp.where(alive, tok, pad_id)
    hit, window = stops.check(tok, state.window, stop_ids, stop_sequences)
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
      done=state.done | (alive & hit),
      lengths=state.lengths + alive.astype(jnp.int32),
      last_token=tok,
      # The next input's position; a finished row feeds padding.
      last_pos=jnp.where(alive, state.last_pos + 1, -1),
      tokens=col(state.tokens, tok),
      logp=col(state.logp, jnp.where(alive, logp, zero)),
      policy_logp=col(state.policy_logp, jnp.where(alive, policy_logp, zero)),
      logits=all_logits,
      window=window,
    )

  # Prefill: the whole prompt in one call; its last logits give token 0.
  slots = attention_kernels.cache_slots(
    p + t_max - 1, model_cfg.decode_attention
  )
  cache = engine.constrain_cache(
    transformer.init_cache(model_cfg, n, slots), mesh
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
    rng=batch(row_keys(rng, n, row_offset)),
    logits=(
      batch(jnp.zeros((n, t_max, model_cfg.vocab_size), jnp.float32))
      if return_logits
      else None
    ),
    window=jax.tree.map(batch, stops.init_window(n, stop_sequences)),
  )
  state = record(state, logits)

  def cond(state: SampleState):
    return (state.step < t_max) & jnp.any(live(state))

  def body(state: SampleState):
    logits, cache = forward(
      state.last_token[:, None], state.last_pos[:, None], state.cache
    )
    state = record(state.replace(cache=cache), logits)
    done = (~live(state)).sum(dtype=jnp.int32)
    engine.report(progress_every, state.step - 1, state.step, cond(state), done)
    return state

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
