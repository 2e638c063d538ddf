"""The jitted loop of continuous batching (continuous.py): the slots' state,
a refill (prefill of waiting prompts into free slots), decode steps, and
rounds of both, run inside one while_loop (`run`) or in calls from a host
loop (`round_jit`: a budget of decode steps per call, state donated). Shapes
as in continuous.py.
"""

import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib
from rlreason.model import attention_kernels
from rlreason.model import transformer
from rlreason.sampling import engine
from rlreason.sampling import sampler as sampler_lib
from rlreason.sampling import stops
from rlreason.sampling.draw import row_keys


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


REFILL_SCOPE = "refill"  # the name scope of a refill's ops (HLO op_name)


class Rows(NamedTuple):
  """The call's per-row inputs, on device: prompts [M, P], keys [M],
  budgets [M]."""

  tokens: jax.Array
  positions: jax.Array
  keys: jax.Array
  limits: jax.Array


STATIC = (
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
RUN_JIT = dict(static_argnames=STATIC)
ROUND_JIT = dict(static_argnames=STATIC, donate_argnums=0)


def _init(params, tokens, positions, rng, row_offset, limits, **static):
  """Casts the weights and lays out the empty slots and row buffers."""
  cfg, mesh, t_max = (
    static["model_cfg"],
    static["mesh"],
    static["max_new_tokens"],
  )
  ns, (m, p) = static["slots"], tokens.shape
  batch = functools.partial(_batch, mesh=mesh)
  rows = Rows(
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
  return state, transformer.compute_params(params, cfg), rows


def _batch(x, mesh):
  """x split by its leading (row or slot) axis over the rollout batch axes."""
  return engine.constrain(x, ("batch",) + (None,) * (x.ndim - 1), mesh)


def _advance(state, which, live, logits, next_pos, rows: Rows, **static):
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


def _refill(state, params, rows: Rows, **static):
  """Prefills the next `refill_rows` waiting prompts into free slots (the
  lowest-numbered first) and draws their first tokens."""
  cfg, mesh = static["model_cfg"], static["mesh"]
  ns, r = state.row.shape[0], static["refill_rows"]
  m, p = rows.tokens.shape
  shards = _refill_shards(mesh, ns, r)
  local, free = _free_slots(state.free, r, shards)  # [shards, R / shards]
  which = (local + ns // shards * jnp.arange(shards)[:, None]).reshape(r)
  free = free.reshape(r)
  # The waiting prompts in order, one per free slot taken.
  row = state.next_row + jnp.cumsum(free) - 1
  ok = free & (row < m)
  row = jnp.clip(row, 0, m - 1)
  tok, pos = rows.tokens[row], rows.positions[row]  # [R, P]
  logits, pre = engine.last_logits(
    params, tok, pos, transformer.init_cache(cfg, r, p), cfg, mesh
  )
  s = jnp.where(ok, which, ns)  # out of range: dropped
  into = jnp.where(ok.reshape(shards, -1), local, ns // shards)
  put = functools.partial(_put_local, into=into, p=p, mesh=mesh)
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


def batch_shards(mesh) -> int:
  """How many shards the rollout's batch (rows, slots) is split into."""
  if mesh is None:
    return 1
  return mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)


def refill_in_place(slots: int, refill_rows: int, shards: int) -> bool:
  """Whether a refill writes each row on its own device (_free_slots):
  the slots and the refill rows split evenly over the shards."""
  return slots % shards == 0 and refill_rows % shards == 0


def _refill_shards(mesh, slots: int, refill_rows: int) -> int:
  """The shards a refill writes each on its own device (1: it cannot)."""
  k = batch_shards(mesh)
  return k if refill_in_place(slots, refill_rows, k) else 1


def _free_slots(free, r: int, shards: int):
  """r free slots, r / shards from each shard's slots (its block of the
  batch-split cache), the lowest-numbered first: ([shards, r / shards]
  slot indices within the shard, whether each is free). Refill row j, on
  shard j // (r / shards) like its prefill, goes into a slot on the same
  device, so the refill writes the cache where it lies: with slots chosen
  across shards, XLA gathered every refill row's K / V on every device
  (800 GiB per chip for a 32B model's 128-row refill of 25.6k-token
  prompts on v5p-256)."""
  f = free.reshape(shards, -1)
  local = jnp.argsort(~f, axis=1, stable=True)[:, : r // shards]
  return local, jnp.take_along_axis(f, local, axis=1)


def _put_local(buf, x, *, into, p: int, mesh):
  """buf [slots, ...] with x [R, ...] written at columns [:p] of slots
  `into` [shards, R / shards] (slot within the shard; out of range:
  dropped), shard by shard."""
  shards = into.shape[0]
  axes = ("batch", None) + transformer.CACHE_AXES[1:]
  split = (
    lambda a: engine.constrain(  # noqa: E731
      a.reshape(shards, -1, *a.shape[1:]), axes, mesh
    )
  )
  out = jax.vmap(
    lambda b, u, s: b.at[s, :, :p].set(u, mode="drop"),
  )(split(buf), split(x.astype(buf.dtype)), into)
  return out.reshape(buf.shape)


def _decode(state, params, rows: Rows, **static):
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


def _round(state, params, rows: Rows, **static):
  """Refills every free slot it can, then up to refill_every decode steps
  (fewer once no slot is live)."""
  m, r = rows.tokens.shape[0], static["refill_rows"]

  def due(s):  # a full prefill's worth of free slots, or nothing left to run
    free = s.free.sum(dtype=jnp.int32)
    full = free >= jnp.minimum(r, m - s.next_row)
    return _waiting(s, m) & (free > 0) & (full | jnp.all(s.free))

  # Named so the planner tells a refill's collectives from a decode
  # step's (plan/hlo_loops: neither loop's trip count is in the HLO).
  with jax.named_scope(REFILL_SCOPE):
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


@functools.partial(jax.jit, **RUN_JIT)
def run(params, tokens, positions, rng, row_offset, limits, **static):
  state, params, rows = _init(
    params, tokens, positions, rng, row_offset, limits, **static
  )
  return jax.lax.while_loop(
    lambda s: _more(s, tokens.shape[0]),
    lambda s: _round(s, params, rows, **static),
    state,
  )


@functools.partial(jax.jit, static_argnames=STATIC)
def start(params, tokens, positions, rng, row_offset, limits, **static):
  """(state, rows) for round_jit: the weights are not among its outputs,
  so the host loop holds no cast copy of them between calls."""
  state, _, rows = _init(
    params, tokens, positions, rng, row_offset, limits, **static
  )
  return state, rows


@functools.partial(jax.jit, **ROUND_JIT)
def round_jit(state, params, rows, budget, **static):
  """Rounds until `budget` decode steps have run in this call (one round
  for budget 1: a round decodes at least one step) or no work is left.
  Returns the state, whether work is left and the rows finished so far;
  the rounds are those of `run`, wherever the calls split them. The
  weights are cast to the compute dtype inside, as `run` casts them (a
  no-op for the rollout's, already cast)."""
  params = transformer.compute_params(params, static["model_cfg"])
  m, start = rows.tokens.shape[0], state.steps
  state = jax.lax.while_loop(
    lambda s: _more(s, m) & (s.steps - start < budget),
    lambda s: _round(s, params, rows, **static),
    state,
  )
  live = (~state.free).sum(dtype=jnp.int32)
  return state, _more(state, m), state.next_row - live


@jax.jit
def output(state: SlotState) -> sampler_lib.SampleOutput:
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


@jax.jit
def finished(state: SlotState) -> jax.Array:
  """[M] the row has been admitted and its slot freed: its outputs are
  final."""
  m = state.lengths.shape[0]
  live = jnp.where(state.free, m, state.row)  # m: no row
  in_slot = jnp.zeros((m + 1,), bool).at[live].set(True)[:m]
  return (jnp.arange(m) < state.next_row) & ~in_slot


@jax.jit
def rows_of(state: SlotState, ids: jax.Array) -> sampler_lib.SampleOutput:
  """output(state) at rows `ids` [k] (host-chosen, identical on every
  process)."""
  return jax.tree.map(lambda x: x[ids], output(state))
