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
times both. Given a `progress` callback, the loop runs in calls of
engine.PROGRESS_STEPS decode steps instead (the same rounds) and reports
the rows finished after each: host calls, not a report from inside the
loop as the static sampler's, so that the persistent compilation cache
keeps the program (it keeps none with a host callback), at the same
per-chip bytes (plan_results/NOTES.md, session 78). The loop itself (slot
state, refill, decode, rounds) is in continuous_loop.py.

Shapes: M prompts (rows), P prompt length, T = max_new_tokens, S = P + T - 1
cache slots, V vocab; `slots` decode slots.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.model.transformer import ModelConfig
from rlreason.sampling import continuous_loop as loop
from rlreason.sampling import engine
from rlreason.sampling import sampler as sampler_lib
from rlreason.sampling.draw import Sampling

REFILL_MODES = ("loop", "host")


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
  progress: Callable[[int], None] | None = None,
  interrupt: Callable[[], None] | None = None,
  on_rows: Callable[[np.ndarray, sampler_lib.SampleOutput], None] | None = None,
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
    progress: called with the number of rows finished after each host
      call but the last (refill="host": each round; "loop": each
      engine.PROGRESS_STEPS decode steps); the samples are the same with
      or without it.
    interrupt: called after each of those host calls but the last (given
      alone, the loop runs in them as with `progress`); it raises to
      abandon the sampling there (rollout.generate's).
    on_rows: called after each of those host calls, the last included
      (given alone, the loop runs in them as with `progress`), with the
      rows finished since the previous one, if any: their indices [k] and
      outputs on the host (numpy SampleOutput of k rows): a rollout's
      journal (rollout.generate).

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
    or default_refill_rows(slots, loop.batch_shards(mesh)),
    refill_every=int(refill_every),
  )
  limits = (
    jnp.full((m,), max_new_tokens, jnp.int32)
    if row_limits is None
    else row_limits
  )
  args = (params, tokens, positions, rng, row_offset, limits)
  hooks = (progress, interrupt, on_rows)
  if refill == "loop" and all(h is None for h in hooks):
    run = engine.jitted(loop.run, compiler_options, **loop.RUN_JIT)
    state = run(*args, **static)
  else:
    state, rows = loop.start(*args, **static)
    round_ = engine.jitted(loop.round_jit, compiler_options, **loop.ROUND_JIT)
    budget = np.int32(1 if refill == "host" else engine.PROGRESS_STEPS)
    if mesh is not None:
      budget = mesh_lib.put_global(budget, mesh_lib.replicated(mesh))
    more, handed = True, np.zeros(m, bool)  # rows given to on_rows
    while more:
      state, more, done = round_(state, params, rows, budget, **static)
      more = bool(more)  # waits for the call
      if on_rows is not None:
        handed = _hand_over(state, handed, on_rows)
      if progress is not None and more:
        progress(int(done))
      if interrupt is not None and more:
        interrupt()
  out = loop.output(state)
  if not return_stats:
    return out
  steps, busy, prefills = jax.device_get(
    (state.steps, state.busy, state.prefills)
  )
  return out, Stats(int(steps), int(busy), int(prefills), slots)


def _hand_over(state, handed: np.ndarray, on_rows) -> np.ndarray:
  """Calls on_rows with the rows finished and not yet handed over; returns
  the rows handed over so far. The gather's row count is rounded up to a
  power of two (copies of the last row, cut on the host), so a call
  compiles it for a few shapes only."""
  new = np.flatnonzero(mesh_lib.to_host(loop.finished(state)) & ~handed)
  if not len(new):
    return handed
  ids = np.full(1 << (len(new) - 1).bit_length(), new[-1], np.int32)
  ids[: len(new)] = new
  out = mesh_lib.to_host(loop.rows_of(state, ids))
  on_rows(new, jax.tree.map(lambda x: x[: len(new)], out))
  handed = handed.copy()
  handed[new] = True
  return handed


def default_refill_rows(slots: int, shards: int = 1) -> int:
  """Prompts per refill prefill when not given: an eighth of the slots
  (measured best of 4, 8, 16 of 64 slots, bench.rollout_lengths), rounded
  up to a multiple of the rollout's batch shards (a refill of rows the
  shards do not divide is not split: every device would prefill all of
  them, 128 GB per chip for gspo's preset on v5p-128), at most the slots."""
  rows = -(-max(1, slots // 8) // shards) * shards
  return min(rows, slots)


def cache_size() -> int:
  """How many variants of the jitted loop are compiled in this process."""
  return loop.run._cache_size() + loop.round_jit._cache_size()  # pylint: disable=protected-access
