"""Multi-turn rollouts: decode a turn, step the environment, append its
observation to the KV cache, decode the next turn.

  ro = multiturn.generate(params, prompts, envs, rng, step,
                          model_cfg=model_cfg, tokenizer=tok, max_turns=3,
                          turn_tokens=24, obs_tokens=48,
                          stop_strings=("\\n", "</search>"), mesh=mesh)

Per turn, one jitted `segments.decode` (a lax.while_loop, as
sampling.sample) samples up to `turn_tokens` tokens for every live episode
and stops a row at EOS, a turn stop id, or a stop string; the host decodes
the action text and calls `env.step`; one jitted `segments.extend` writes
[last action token, observation tokens] into the same cache (rows left
padded to a fixed width, padding has position -1 and is never attended),
and its last logits start the next turn. Nothing is recomputed: the cache
of the prompt and of every earlier turn is reused.

Stop strings (an env's action end tags, e.g. "</search>", envs.base) are
checked twice. On device, as token sequences: stops.token_sequences gives
the tokenizer's encodings of each string, and the decode loop ends a row
once its last tokens equal one (stops.check). A BPE model can write the
same text with another split, which that test misses; so on the host the
decoded action is searched too, and an action that runs past its first
stop string is cut after the fewest tokens whose text contains it: the cut
tokens leave the action, and segments.rewind hides those already fed from
the cache, so the episode continues exactly as if decoding had stopped
there. (sampling.sample / rollout.generate have only the device test.)

Sharding: with a mesh, the parameters are moved to the rollout layout and
every [N, ...] array (prompts, the cache, each turn's start positions and
observation block, the outputs) is split over the mesh's batch axes as in
rollout.generate (replicated when N is not a multiple of their size);
the host steps the environments between turns on gathered copies. As in
rollout.generate, the rows run their episodes in calls of as many as the
devices' free memory holds (`rows_per_call`; each call its own cache):
a paper-scale batch's caches do not fit at once (search_r1's 2560 rows
of 5.5k slots of a 3B model hold 1.6 TB).

The result is a `MultiTurnRollout` (transcript.py): the fields of
`types.Rollout` (so the loop, make_batch and the losses take it unchanged)
plus turn bookkeeping. Each row's completion is compacted on the host
(the cache's padding gaps dropped), so a full forward over `tokens` sees
exactly the context each token was sampled with:
`policy.completion_logprobs` reproduces `logp`.
`mask` is 1 on action tokens only: observation tokens are context, never
trained on (Search-R1's retrieved-token masking), and GAE / REINFORCE++
(advantages.py) carry values and returns across them unchanged;
turn_credit.py turns per-turn rewards into token rewards and advantages.

Shapes: N = B * G rows, P prompt length, K = max_turns, Tt = turn_tokens,
O = obs_tokens, T = K * Tt + (K - 1) * O completion budget.
"""

import dataclasses
import functools
from concurrent import futures
from typing import Any, Callable, Sequence

import jax
import numpy as np

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason.sampling import rollout as rollout_lib
from rlreason.sampling import padding
from rlreason.sampling import rollout_layout
from rlreason.sampling import rollout_memory
from rlreason.sampling import draw as sampling_lib
from rlreason.sampling import segments
from rlreason.sampling import stops
from rlreason.envs import base as env_base
from rlreason.envs import transcript
from rlreason.envs.transcript import ACTION, OBSERVATION, MultiTurnRollout
from rlreason.envs.transcript import completion_budget


def generate(
  params: Any,
  prompts: Sequence[Sequence[int]],
  envs: Sequence[Any],
  rng: jax.Array,
  step: int,
  *,
  model_cfg,
  tokenizer,
  max_turns: int,
  turn_tokens: int,
  obs_tokens: int,
  group_size: int = 1,
  sampling: sampling_lib.Sampling | None = None,
  turn_stop_ids: Sequence[int] = (),
  max_prompt_len: int | None = None,
  bucket: int = 32,
  env_workers: int = 8,
  mesh: jax.sharding.Mesh | None = None,
  stop_strings: Sequence[str] = (),
  rows_per_call: int = 0,
  progress: Callable[[int], None] | None = None,
  interrupt: Callable[[], None] | None = None,
) -> MultiTurnRollout:
  """Runs one episode per row: G rows per prompt, envs already reset.

  Args:
    params: the policy.
    prompts: B token-id lists (not padded).
    envs: N = B * G environments, row-major like the rows (reset by the
      caller, so it controls what each episode sees).
    rng: base key; turn k samples with fold_in(fold_in(rng, step), k).
    step: the RL step.
    model_cfg, tokenizer: the model and its tokenizer.
    max_turns: K; the episode is cut after K turns (finish "length").
    turn_tokens: Tt, the most tokens of one action.
    obs_tokens: O, observations are truncated to this many tokens.
    group_size: G.
    sampling: temperature / filters (default Sampling()).
    turn_stop_ids: ids that end a turn (besides EOS, which also does).
    max_prompt_len, bucket: as padding.pad_prompts.
    env_workers: threads stepping the environments of one turn.
    mesh: decode on this mesh: parameters in the rollout layout
      (mesh.ROLLOUT_RULES; regrouped to model_cfg.rollout_tensor,
      rollout_layout.sampling_mesh), rows split over its batch axes, the
      outputs on `mesh`; None: where the parameters are, rows unsplit.
    stop_strings: texts that end a turn (e.g. an env's "</search>"),
      checked as token sequences on device and as text on the host (see
      the module docstring).
    rows_per_call: rows whose episodes run at once, each call in a cache
      of its own (> 0), else as many as the devices' free memory holds
      (rollout_memory.call_rows; all N where it is not known). Each row
      draws with its batch index's key, so calls of any size sample alike.
    progress: called with the episodes finished so far after each turn
      that leaves some going (the loop's rollout progress).
    interrupt: called there too; it raises to abandon the episodes
      (rollout.generate's).

  Returns:
    A MultiTurnRollout with T = K * Tt + (K - 1) * O.
  """
  sampling = sampling or sampling_lib.Sampling()
  stop_strings = tuple(s for s in stop_strings if s)
  stop_ids, stop_seqs = stops.split(
    (tokenizer.eos_id, *turn_stop_ids),
    stops.token_sequences(tokenizer, stop_strings),
  )
  stops.check_vocab(stop_ids, stop_seqs, model_cfg.vocab_size)
  tokens, positions = padding.pad_prompts(
    prompts, tokenizer.pad_id, max_len=max_prompt_len, bucket=bucket
  )
  b, p = tokens.shape
  n = b * group_size
  if len(envs) != n:
    raise ValueError(f"{len(envs)} envs for {n} rows (B={b}, G={group_size})")
  tokens = np.repeat(tokens, group_size, axis=0)
  positions = np.repeat(positions, group_size, axis=0)
  rows_on = functools.partial(mesh_lib.put_rows, mesh)  # the outputs'
  mesh = rollout_layout.sampling_mesh(mesh, model_cfg)  # --rollout_tensor
  params, rng = rollout_layout.on_mesh(
    params, jax.random.fold_in(rng, step), mesh, model_cfg
  )
  k_max, o = max_turns, obs_tokens
  t_total = completion_budget(k_max, turn_tokens, o)
  slots = p + k_max * turn_tokens + (k_max - 1) * (o + 1)
  per_call = rollout_memory.call_rows(
    rows_per_call, n, model_cfg, p, slots - p, mesh, params
  )
  episodes = functools.partial(
    _episodes,
    params,
    rng,
    model_cfg=model_cfg,
    tokenizer=tokenizer,
    max_turns=k_max,
    turn_tokens=turn_tokens,
    obs_tokens=o,
    slots=slots,
    sampling=sampling,
    stop_ids=stop_ids,
    stop_seqs=stop_seqs,
    stop_strings=stop_strings,
    env_workers=env_workers,
    mesh=mesh,
    interrupt=interrupt,
  )
  calls = [
    episodes(
      tokens[lo : lo + per_call],
      positions[lo : lo + per_call],
      envs[lo : lo + per_call],
      lo,
      progress=None
      if progress is None
      else rollout_lib.offset_progress(progress, lo, per_call),
    )
    for lo in range(0, n, per_call)
  ]
  rows, actions, observations = (
    sum((c[i] for c in calls), []) for i in (0, 2, 3)
  )
  turn_rewards = np.concatenate([c[1] for c in calls])
  finish = np.concatenate([c[4] for c in calls])
  return transcript.assemble(
    tokens,
    positions,
    rows,
    t_total,
    turn_rewards,
    actions,
    observations,
    finish,
    tokenizer,
    group_size,
    rows_on,
  )


def _episodes(
  params,
  rng,
  tokens,
  positions,
  envs,
  row_offset,
  *,
  model_cfg,
  tokenizer,
  max_turns,
  turn_tokens,
  obs_tokens,
  slots,
  sampling,
  stop_ids,
  stop_seqs,
  stop_strings,
  env_workers,
  mesh,
  progress=None,
  interrupt=None,
):
  """One sampler call's episodes: rows [n, P] of the batch from row
  `row_offset` on, in a cache of `slots` slots. Returns each row's
  segments (kind, turn, ids, logp, policy_logp), its turn rewards [n, K],
  action and observation texts, and finish reasons; `progress` gets the
  episodes it has finished after each turn but the last, and `interrupt`
  is called there."""
  n = len(tokens)
  k_max, o = max_turns, obs_tokens
  rows_on = functools.partial(mesh_lib.put_rows, mesh)
  cache = segments.init_cache(model_cfg, n, slots, mesh=mesh)
  logits, cache = segments.extend(
    params, cache, *rows_on((tokens, positions)), model_cfg=model_cfg, mesh=mesh
  )
  pos = positions[:, -1].astype(np.int64) + 1
  active = np.ones(n, bool)
  rows = [[] for _ in range(n)]  # (kind, turn, ids, logp, policy_logp)
  turn_rewards = np.zeros((n, k_max), np.float32)
  actions, observations = [[] for _ in range(n)], [[] for _ in range(n)]
  finish = np.full(n, "length", object)
  for k in range(k_max):
    seg, cache = segments.decode(
      params,
      cache,
      logits,
      *rows_on((pos.astype(np.int32), active)),
      jax.random.fold_in(rng, k),
      row_offset,
      model_cfg=model_cfg,
      max_new_tokens=turn_tokens,
      sampling=sampling,
      stop_ids=stop_ids,
      pad_id=tokenizer.pad_id,
      stop_sequences=stop_seqs,
      mesh=mesh,
    )
    seg = mesh_lib.to_host(seg)
    block = np.full((n, o + 1), tokenizer.pad_id, np.int32)
    block_pos = np.full((n, o + 1), -1, np.int32)
    live = np.flatnonzero(active)
    # Host check of the stop strings: cut actions that ran past one.
    keep = {
      i: stops.kept_tokens(
        tokenizer, seg.tokens[i, : seg.lengths[i]], stop_strings
      )
      for i in live
    }
    texts = {
      i: tokenizer.decode(seg.tokens[i, : keep[i]].tolist()) for i in live
    }
    # Environment steps (sandboxed subprocesses, retrieval) run in threads:
    # one env per row, so they share nothing.
    with futures.ThreadPoolExecutor(env_workers) as pool:
      results = dict(
        zip(live, pool.map(lambda i, t=texts: envs[i].step(t[i]), live))
      )
    # Rows cut short that go on: their cache is hidden from this position.
    from_pos = np.full(n, np.iinfo(np.int32).max, np.int32)
    for i in live:
      ln = keep[i]
      ids = seg.tokens[i, :ln]
      rows[i].append(
        (ACTION, k, ids, seg.logp[i, :ln], seg.policy_logp[i, :ln])
      )
      actions[i].append(texts[i])
      res = results[i]
      turn_rewards[i, k] = res.reward
      if res.done or k == k_max - 1 or ids[-1] == tokenizer.eos_id:
        active[i] = False
        if res.done or ids[-1] == tokenizer.eos_id:
          finish[i] = "eos"
        continue
      obs = tokenizer.encode(res.observation)[:o]
      observations[i].append(tokenizer.decode(obs))
      rows[i].append((OBSERVATION, k, np.asarray(obs, np.int32), None, None))
      width = len(obs) + 1
      if ln < seg.lengths[i]:
        # Tokens ln - 1 .. were fed from position pos + ln - 1 on; the
        # block feeds token ln - 1 again, in front of the observation.
        from_pos[i] = pos[i] + ln - 1
      block[i, -width:] = [ids[-1], *obs]
      block_pos[i, -width:] = pos[i] + ln - 1 + np.arange(width)
      pos[i] += ln + len(obs)
    if not active.any():
      break
    if progress is not None:
      progress(int(n - active.sum()))
    if interrupt is not None:
      interrupt()
    if (from_pos < np.iinfo(np.int32).max).any():
      cache = segments.rewind(cache, rows_on(from_pos))
    logits, cache = segments.extend(
      params,
      cache,
      *rows_on((block, block_pos)),
      model_cfg=model_cfg,
      mesh=mesh,
    )
  return rows, turn_rewards, actions, observations, finish


def plan_config(cfg):
  """The config at the shapes a multi-turn run's programs take, for
  experiments/plan.py (an experiment's `plan_config` hook): its train
  batch is P + T tokens, T = completion_budget, where max_new_tokens is
  not read. Its rollout is compiled as the single-turn sampler over the
  same cache (P + T slots per row); `decode_tokens` times it."""
  t = completion_budget(cfg.max_turns, cfg.turn_tokens, cfg.obs_tokens)
  return dataclasses.replace(cfg, max_new_tokens=t)


def decode_tokens(cfg) -> int:
  """Of an episode's T tokens, those decoded (its K actions'); the
  observations are prefilled (experiments/plan.py's `decode_tokens`
  hook: the rollout's roofline time, plan/summary.times)."""
  return cfg.max_turns * cfg.turn_tokens


def make_generate_fn(
  env_factory: Callable[[], Any],
  *,
  max_turns: int,
  turn_tokens: int,
  obs_tokens: int,
  stop_strings: Sequence[str] | None = None,
) -> Callable:
  """A context.Context generate_fn that runs `generate` with fresh envs.

  `env_factory()` makes one environment per row, reset on the row's
  example. A turn ends at EOS or at one of `stop_strings`; None takes the
  environments' own (envs.base.stop_strings: e.g. "\\n", "</search>" and
  "</answer>" for the search env), multi-token ones included. The budgets
  are checked here, when a run starts (config.ConfigError naming the flag).
  """
  for name, value, least in (
    ("max_turns", max_turns, 1),
    ("turn_tokens", turn_tokens, 1),
    ("obs_tokens", obs_tokens, 0),
  ):
    if not isinstance(value, (int, np.integer)) or value < least:
      raise config.ConfigError(f"--{name}={value!r} must be >= {least}")

  def generate_fn(
    ctx, params, examples, rng, step, *, group_size, sampling, progress=None
  ):
    envs = []
    for e in examples:
      for _ in range(group_size):
        env = env_factory()
        env.reset(e)
        envs.append(env)
    strings = stop_strings
    if strings is None:
      strings = tuple(
        dict.fromkeys(s for env in envs for s in env_base.stop_strings(env))
      )
    return generate(
      params,
      ctx.encode_prompts(examples),
      envs,
      rng,
      step,
      model_cfg=ctx.segments_model_cfg,
      tokenizer=ctx.tokenizer,
      max_turns=max_turns,
      turn_tokens=turn_tokens,
      obs_tokens=obs_tokens,
      group_size=group_size,
      sampling=sampling,
      stop_strings=strings,
      max_prompt_len=ctx.cfg.max_prompt_len,
      rows_per_call=getattr(ctx.cfg, "rollout_rows", 0),
      mesh=ctx.mesh,
      progress=progress,
      interrupt=getattr(ctx, "interrupt", None),  # Context's
    )

  return generate_fn
