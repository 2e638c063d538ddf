"""Continuous batching: a fixed set of decode slots, refilled as rows finish.

  out = continuous.sample(params, tokens, positions, rng, slots=16,
                          model_cfg=model_cfg, max_new_tokens=1024, ...)

The static sampler (sampler.py) decodes a batch until its longest row
stops, so with long-tailed response lengths most of its decode work goes to
rows that have already finished. Here M prompts share `slots` decode slots
over one cache of [slots, K, P + T - 1, Dh]: every round, free slots take
the next waiting prompts (a prefill of `refill_rows` prompts at a time,
written into those slots' cache rows), then up to `refill_every` decode
steps run on every slot. Each slot writes its cache at its own column (the
cache index is [slots], transformer.Cache), so a refilled row's prompt sits
at columns [0, P) of its slot exactly as in the static sampler.

Row m draws token t with fold_in(fold_in(rng, row_offset + m), t), the
static sampler's key (draw.row_keys, step_keys), so its tokens depend on its
prompt and keys only, not on its slot or when it ran: the outputs equal the
static sampler's for the same rows, up to the numerics of the batched
forward (tested).

Rounds run inside one jitted while_loop (refill="loop") or from a host loop
of jitted rounds with the state donated between them (refill="host"), the
two choices the peers' engines make; experiments/bench/rollout_lengths.py
times both.

Shapes: M prompts (rows), P prompt length, T = max_new_tokens, S = P + T - 1
cache slots, V vocab; `slots` decode slots.
"""

import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.model import attention_kernels
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig
from rlreason.sampling import engine
from rlreason.sampling import sampler as sampler_lib
from rlreason.sampling import stops
from rlreason.sampling.draw import Sampling
from rlreason.sampling.draw import row_keys

REFILL_MODES = ("loop", "host")


@flax.struct.dataclass
class SlotState:
  """Carry of the continuous loop.

  Attributes:
    cache: KV cache of the slots, index [slots] (each slot's next column).
    row: [slots] the prompt row in each slot (-1 before its first).
    t: [slots] tokens drawn for that row so far.
    free: [slots] the slot holds no live row (finished or never filled).
    last_token, last_pos: [slots] the next decode input and its position.
    window: [slots, k - 1] stop-sequence window (stops.check), or None.
    next_row: [] the first prompt not yet admitted.
    steps: [] decode steps run; busy: [] live slots summed over them.
    prefills: [] refill prefills run.
    tokens, logp, policy_logp: [M, T] per-row outputs (sampler.SampleOutput).
    lengths: [M] tokens drawn; eos: [M] the row ended with a stop.
  """

  cache: transformer.Cache
  row: jax.Array
  t: jax.Array
  free: jax.Array
  last_token: jax.Array
  last_pos: jax.Array
  window: jax.Array | None
  next_row: jax.Array
  steps: jax.Array
  busy: jax.Array
  prefills: jax.Array
  tokens: jax.Array
  logp: jax.Array
  policy_logp: jax.Array
  lengths: jax.Array
  eos: jax.Array


class Stats(NamedTuple):
  """Work done by one call: `steps` decode steps over the slots (`busy`
  live slot-steps of them) and `prefills` refill prefills."""

  steps: int
  busy: int
  prefills: int
  slots: int

  @property
  def utilisation(self) -> float:
    """Fraction of decode slot-steps that produced a token."""
    return self.busy / max(1, self.steps * self.slots)


class _Rows(NamedTuple):
  """The call's per-row inputs, on device: prompts [M, P], keys [M],
  budgets [M]."""

  tokens: jax.Array
  positions: jax.Array
  keys: jax.Array
  limits: jax.Array


def sample(
  params: Any,
  tokens: jax.Array,
  positions: jax.Array,
  rng: jax.Array,
  *,
  slots: int,
  model_cfg: ModelConfig,
  max_new_tokens: int,
  sampling: Sampling = Sampling(),  # noqa: B008 - a frozen dataclass
  stop_ids: tuple[int, ...] = (),
  pad_id: int = 0,
  mesh: jax.sharding.Mesh | None = None,
  stop_sequences: tuple[tuple[int, ...], ...] = (),
  row_offset: int = 0,
  row_limits: jax.Array | None = None,
  refill_rows: int = 0,
  refill_every: int = 1,
  refill: str = "loop",
  return_stats: bool = False,
  compiler_options: dict | None = None,
) -> sampler_lib.SampleOutput | tuple[sampler_lib.SampleOutput, Stats]:
  """Samples up to `max_new_tokens` after each prompt, `slots` at a time.

  Args:
    params, tokens, positions, rng, model_cfg, max_new_tokens, sampling,
      stop_ids, pad_id, mesh, stop_sequences, row_offset, row_limits: as
      sampler.sample (tokens [M, P] left padded; the M rows may be many
      more than the slots).
    slots: decode slots (rows in flight), >= 1; more than M is M.
    refill_rows: prompts per refill prefill, in [1, slots]; 0 picks
      default_refill_rows(slots, the mesh's batch shards). A refill waits
      until that many slots are free (or none is live), so no prefill row
      is wasted.
    refill_every: K, the decode steps between refills (>= 1).
    refill: "loop" (rounds inside one jitted while_loop) or "host" (a host
      loop over jitted rounds; one device -> host flag per round).
    return_stats: also return a Stats.
    compiler_options: the jitted loop's (or round's) compile options, as
      sampler.sample.

  Returns:
    A sampler.SampleOutput for the M rows (logits are not recorded), and
    the Stats when asked.
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
  for name, value in (("slots", slots), ("refill_every", refill_every)):
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name}={value!r} must be an int >= 1")
  if refill not in REFILL_MODES:
    raise ValueError(f"refill={refill!r}; expected one of {REFILL_MODES}")
  m = tokens.shape[0]
  slots = min(int(slots), m)
  if not isinstance(refill_rows, (int, np.integer)) or not (
    0 <= refill_rows <= slots
  ):
    raise ValueError(f"refill_rows={refill_rows!r} must be in [0, {slots}]")
  static = dict(
    model_cfg=model_cfg,
    max_new_tokens=int(max_new_tokens),
    sampling=sampling,
    stop_ids=stop_ids,
    pad_id=int(pad_id),
    mesh=mesh,
    stop_sequences=stop_sequences,
    slots=slots,
    refill_rows=int(refill_rows)
    or default_refill_rows(slots, _batch_shards(mesh)),
    refill_every=int(refill_every),
  )
  limits = (
    jnp.full((m,), max_new_tokens, jnp.int32)
    if row_limits is None
    else row_limits
  )
  args = (params, tokens, positions, rng, row_offset, limits)
  if refill == "loop":
    run = engine.jitted(_run, compiler_options, **_RUN_JIT)
    state = run(*args, **static)
  else:
    state, params, rows = _start(*args, **static)
    round_ = engine.jitted(_round_jit, compiler_options, **_ROUND_JIT)
    more = True
    while more:
      state, more = round_(state, params, rows, **static)
  out = _output(state)
  if not return_stats:
    return out
  steps, busy, prefills = jax.device_get(
    (state.steps, state.busy, state.prefills)
  )
  return out, Stats(int(steps), int(busy), int(prefills), slots)


def default_refill_rows(slots: int, shards: int = 1) -> int:
  """Prompts per refill prefill when not given: an eighth of the slots
  (measured best of 4, 8, 16 of 64 slots, bench.rollout_lengths), rounded
  up to a multiple of the rollout's batch shards (a refill of rows the
  shards do not divide is not split: every device would prefill all of
  them, 128 GB per chip for gspo's preset on v5p-128), at most the slots."""
  rows = -(-max(1, slots // 8) // shards) * shards
  return min(rows, slots)


def _batch_shards(mesh) -> int:
  if mesh is None:
    return 1
  return mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)


def cache_size() -> int:
  """How many variants of the jitted loop are compiled in this process."""
  return _run._cache_size() + _round_jit._cache_size()  # pylint: disable=protected-access


_STATIC = (
  "model_cfg",
  "max_new_tokens",
  "sampling",
  "stop_ids",
  "pad_id",
  "mesh",
  "stop_sequences",
  "slots",
  "refill_rows",
  "refill_every",
)
_RUN_JIT = dict(static_argnames=_STATIC)
_ROUND_JIT = dict(static_argnames=_STATIC, donate_argnums=0)


def _init(params, tokens, positions, rng, row_offset, limits, **static):
  """Casts the weights and lays out the empty slots and row buffers."""
  cfg, mesh, t_max = (
    static["model_cfg"],
    static["mesh"],
    static["max_new_tokens"],
  )
  ns, (m, p) = static["slots"], tokens.shape
  batch = functools.partial(_batch, mesh=mesh)
  rows = _Rows(
    tokens=batch(tokens.astype(jnp.int32)),
    positions=batch(positions.astype(jnp.int32)),
    keys=batch(row_keys(rng, m, row_offset)),
    limits=batch(limits.astype(jnp.int32)),
  )
  slots = attention_kernels.cache_slots(p + t_max - 1, cfg.decode_attention)
  cache = transformer.init_cache(cfg, ns, slots)
  cache = engine.constrain_cache(
    cache._replace(index=jnp.zeros((ns,), jnp.int32)), mesh
  )
  out = lambda dtype, fill: batch(jnp.full((m, t_max), fill, dtype))
  vec = lambda fill, dtype=jnp.int32: batch(jnp.full((ns,), fill, dtype))
  zero = jnp.zeros((), jnp.int32)
  state = SlotState(
    cache=cache,
    row=vec(-1),
    t=vec(0),
    free=vec(True, bool),
    last_token=vec(static["pad_id"]),
    last_pos=vec(-1),
    window=jax.tree.map(batch, stops.init_window(ns, static["stop_sequences"])),
    next_row=zero,
    steps=zero,
    busy=zero,
    prefills=zero,
    tokens=out(jnp.int32, static["pad_id"]),
    logp=out(jnp.float32, 0.0),
    policy_logp=out(jnp.float32, 0.0),
    lengths=batch(jnp.zeros((m,), jnp.int32)),
    eos=batch(jnp.zeros((m,), bool)),
  )
  return state, engine.compute_params(params, cfg), rows


def _batch(x, mesh):
  """x split by its leading (row or slot) axis over the rollout batch axes."""
  return engine.constrain(x, ("batch",) + (None,) * (x.ndim - 1), mesh)


def _advance(state, which, live, logits, next_pos, rows: _Rows, **static):
  """Draws the next token of the rows in slots `which` [R] (where `live`) from
  `logits` [R, V]: writes the row buffers and the slots' decode inputs;
  `next_pos` [R] is the drawn token's position."""
  ns, m = state.row.shape[0], state.lengths.shape[0]
  row = state.row[which]
  t = state.t[which]
  keys = jax.vmap(jax.random.fold_in)(rows.keys[row], t)
  tok, logp, policy_logp = static["sampling"].draw(logits, keys)
  window = None if state.window is None else state.window[which]
  hit, window = stops.check(
    tok, window, static["stop_ids"], static["stop_sequences"]
  )
  ended = hit | (t + 1 >= rows.limits[row])
  r = jnp.where(live, row, m)  # out of range: dropped
  s = jnp.where(live, which, ns)
  at_row = lambda buf, x: buf.at[r].set(x, mode="drop")  # noqa: E731
  at_cell = lambda buf, x: buf.at[r, t].set(x, mode="drop")  # noqa: E731
  at_slot = lambda buf, x: buf.at[s].set(x, mode="drop")  # noqa: E731
  return state.replace(
    t=at_slot(state.t, t + 1),
    free=at_slot(state.free, ended),
    last_token=at_slot(state.last_token, tok),
    last_pos=at_slot(state.last_pos, next_pos),
    window=None if window is None else at_slot(state.window, window),
    tokens=at_cell(state.tokens, tok),
    logp=at_cell(state.logp, logp),
    policy_logp=at_cell(state.policy_logp, policy_logp),
    lengths=at_row(state.lengths, t + 1),
    eos=at_row(state.eos, hit),
  )


def _refill(state, params, rows: _Rows, **static):
  """Prefills the next `refill_rows` waiting prompts into free slots (the
  lowest-numbered first) and draws their first tokens."""
  cfg, mesh = static["model_cfg"], static["mesh"]
  ns, r = state.row.shape[0], static["refill_rows"]
  m, p = rows.tokens.shape
  which = jnp.argsort(~state.free, stable=True)[:r]  # free slots first
  row = state.next_row + jnp.arange(r)
  ok = state.free[which] & (row < m)
  row = jnp.minimum(row, m - 1)
  tok, pos = rows.tokens[row], rows.positions[row]  # [R, P]
  logits, pre = engine.last_logits(
    params, tok, pos, transformer.init_cache(cfg, r, p), cfg, mesh
  )
  s = jnp.where(ok, which, ns)  # out of range: dropped
  put = lambda buf, x: buf.at[s, :, :p].set(x.astype(buf.dtype), mode="drop")  # noqa: E731
  cache = state.cache
  empty = jnp.full((r, cache.pos.shape[1] - p), -1, jnp.int32)
  cache = engine.constrain_cache(
    transformer.Cache(
      k=tuple(put(a, b) for a, b in zip(cache.k, pre.k, strict=True)),
      v=tuple(put(a, b) for a, b in zip(cache.v, pre.v, strict=True)),
      pos=cache.pos.at[s].set(
        jnp.concatenate([pos, empty], axis=1), mode="drop"
      ),
      index=cache.index.at[s].set(p, mode="drop"),
    ),
    mesh,
  )
  window = state.window
  if window is not None:
    window = window.at[s].set(-1, mode="drop")
  state = state.replace(
    cache=cache,
    row=state.row.at[s].set(row, mode="drop"),
    t=state.t.at[s].set(0, mode="drop"),
    window=window,
    next_row=state.next_row + ok.sum(dtype=jnp.int32),
    prefills=state.prefills + 1,
  )
  return _advance(state, which, ok, logits, pos[:, -1] + 1, rows, **static)


def _decode(state, params, rows: _Rows, **static):
  """One decode step of every slot; free slots feed padding."""
  live = ~state.free
  tok = jnp.where(live, state.last_token, static["pad_id"])
  pos = jnp.where(live, state.last_pos, -1)
  logits, cache = engine.last_logits(
    params,
    tok[:, None],
    pos[:, None],
    state.cache,
    static["model_cfg"],
    static["mesh"],
  )
  # A free slot's column stays put (its garbage write is overwritten later).
  cache = cache._replace(index=jnp.where(live, cache.index, state.cache.index))
  state = state.replace(
    cache=cache,
    steps=state.steps + 1,
    busy=state.busy + live.sum(dtype=jnp.int32),
  )
  which = jnp.arange(live.shape[0])
  return _advance(state, which, live, logits, pos + 1, rows, **static)


def _waiting(state, m):
  return state.next_row < m


def _round(state, params, rows: _Rows, **static):
  """Refills every free slot it can, then up to refill_every decode steps
  (fewer once no slot is live)."""
  m, r = rows.tokens.shape[0], static["refill_rows"]

  def due(s):  # a full prefill's worth of free slots, or nothing left to run
    free = s.free.sum(dtype=jnp.int32)
    full = free >= jnp.minimum(r, m - s.next_row)
    return _waiting(s, m) & (free > 0) & (full | jnp.all(s.free))

  state = jax.lax.while_loop(
    due, lambda s: _refill(s, params, rows, **static), state
  )
  start = state.steps
  return jax.lax.while_loop(
    lambda s: (s.steps - start < static["refill_every"]) & ~jnp.all(s.free),
    lambda s: _decode(s, params, rows, **static),
    state,
  )


def _more(state, m):
  """Work is left: a live slot or a waiting prompt."""
  return ~jnp.all(state.free) | _waiting(state, m)


@functools.partial(jax.jit, **_RUN_JIT)
def _run(params, tokens, positions, rng, row_offset, limits, **static):
  state, params, rows = _init(
    params, tokens, positions, rng, row_offset, limits, **static
  )
  return jax.lax.while_loop(
    lambda s: _more(s, tokens.shape[0]),
    lambda s: _round(s, params, rows, **static),
    state,
  )


_start = jax.jit(_init, static_argnames=_STATIC)


@functools.partial(jax.jit, **_ROUND_JIT)
def _round_jit(state, params, rows, **static):
  state = _round(state, params, rows, **static)
  return state, _more(state, rows.tokens.shape[0])


@jax.jit
def _output(state: SlotState) -> sampler_lib.SampleOutput:
  t_max = state.tokens.shape[1]
  mask = jnp.arange(t_max)[None, :] < state.lengths[:, None]
  return sampler_lib.SampleOutput(
    tokens=state.tokens,  # pad_id past each row's length: never written
    logp=state.logp,
    policy_logp=state.policy_logp,
    mask=mask.astype(jnp.int32),
    lengths=state.lengths,
    finish=jnp.where(
      state.eos, sampler_lib.FINISH_EOS, sampler_lib.FINISH_LENGTH
    ).astype(jnp.int32),
  )
