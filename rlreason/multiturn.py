"""Multi-turn rollouts: decode a turn, step the environment, append its
observation to the KV cache, decode the next turn.

  ro = multiturn.generate(params, prompts, envs, rng, step,
                          model_cfg=model_cfg, tokenizer=tok, max_turns=3,
                          turn_tokens=24, obs_tokens=48,
                          turn_stop_ids=(tok.encode("\n")[0],))

Per turn, one jitted `segments.decode` (a lax.while_loop, as
sampling.sample) samples up to `turn_tokens` tokens for every live episode
and stops a row at a turn stop id or EOS; the host decodes the action text
and calls `env.step`; one jitted `segments.extend` writes [last action
token, observation tokens] into the same cache (rows left padded to a fixed
width, padding has position -1 and is never attended), and its last logits
start the next turn. Nothing is
recomputed: the cache of the prompt and of every earlier turn is reused.

The result is a `MultiTurnRollout`: the fields of `types.Rollout` (so the
loop, make_batch and the losses take it unchanged) plus turn bookkeeping.
Each row's completion is compacted on the host (the cache's padding gaps
dropped), so a full forward over `tokens` sees exactly the context each
token was sampled with: `policy.completion_logprobs` reproduces `logp`.
`mask` is 1 on action tokens only: observation tokens are context, never
trained on (Search-R1's retrieved-token masking), and GAE / REINFORCE++
(advantages.py) carry values and returns across them unchanged;
turn_credit.py turns per-turn rewards into token rewards and advantages.

Shapes: N = B * G rows, P prompt length, K = max_turns, Tt = turn_tokens,
O = obs_tokens, T = K * Tt + (K - 1) * O completion budget.
"""

from concurrent import futures
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import rollout as rollout_lib
from rlreason import sampling as sampling_lib
from rlreason import segments
from rlreason.model import transformer

ACTION, OBSERVATION = 1, 2  # values of MultiTurnRollout.segment


class MultiTurnRollout(NamedTuple):
  """A types.Rollout (same first fields and meaning) plus turn structure.

  Attributes beyond types.Rollout (all host numpy):
    segment: [N, T] int8, ACTION / OBSERVATION, 0 on padding.
    turn: [N, T] int32, turn index of each token, -1 on padding.
    turn_end: [N, K] int32, completion column of each turn's last action
      token, -1 for turns not taken.
    turn_rewards: [N, K] float32, env reward of each turn (0 if not taken).
    num_turns: [N] int32.
    actions: N lists of action texts, one per turn.
    observations: N lists of observation texts.
  """

  tokens: jax.Array
  positions: jax.Array
  prompt_len: int
  logp: jax.Array
  policy_logp: jax.Array
  mask: jax.Array
  lengths: np.ndarray
  finish_reasons: np.ndarray
  texts: list[str]
  prompt_ids: np.ndarray
  segment: np.ndarray
  turn: np.ndarray
  turn_end: np.ndarray
  turn_rewards: np.ndarray
  num_turns: np.ndarray
  actions: list
  observations: list


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
    max_prompt_len, bucket: as rollout.pad_prompts.
    mesh: decode with the parameters in the rollout layout
      (mesh.ROLLOUT_RULES) on this mesh; None: where they are.
    env_workers: threads stepping the environments of one turn.

  Returns:
    A MultiTurnRollout with T = K * Tt + (K - 1) * O.
  """
  sampling = sampling or sampling_lib.Sampling()
  if mesh is not None:
    params = jax.device_put(
      params, rollout_lib.rollout_shardings(mesh, model_cfg)
    )
  tokens, positions = rollout_lib.pad_prompts(
    prompts, tokenizer.pad_id, max_len=max_prompt_len, bucket=bucket
  )
  b, p = tokens.shape
  n = b * group_size
  if len(envs) != n:
    raise ValueError(f"{len(envs)} envs for {n} rows (B={b}, G={group_size})")
  tokens = np.repeat(tokens, group_size, axis=0)
  positions = np.repeat(positions, group_size, axis=0)
  stops = tuple(
    dict.fromkeys((int(tokenizer.eos_id), *map(int, turn_stop_ids)))
  )
  k_max, o = max_turns, obs_tokens
  t_total = k_max * turn_tokens + (k_max - 1) * o
  cache = transformer.init_cache(
    model_cfg, n, p + k_max * turn_tokens + (k_max - 1) * (o + 1)
  )
  logits, cache = segments.extend(
    params, cache, tokens, positions, model_cfg=model_cfg
  )
  rng = jax.random.fold_in(rng, step)
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
      jnp.asarray(pos, jnp.int32),
      jnp.asarray(active),
      jax.random.fold_in(rng, k),
      model_cfg=model_cfg,
      max_new_tokens=turn_tokens,
      sampling=sampling,
      stop_ids=stops,
      pad_id=tokenizer.pad_id,
    )
    seg = jax.device_get(seg)
    block = np.full((n, o + 1), tokenizer.pad_id, np.int32)
    block_pos = np.full((n, o + 1), -1, np.int32)
    live = np.flatnonzero(active)
    texts = {
      i: tokenizer.decode(seg.tokens[i, : seg.lengths[i]].tolist())
      for i in live
    }
    # Environment steps (sandboxed subprocesses, retrieval) run in threads:
    # one env per row, so they share nothing.
    with futures.ThreadPoolExecutor(env_workers) as pool:
      results = dict(
        zip(live, pool.map(lambda i, t=texts: envs[i].step(t[i]), live))
      )
    for i in live:
      ln = int(seg.lengths[i])
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
      block[i, -width:] = [ids[-1], *obs]
      block_pos[i, -width:] = pos[i] + ln - 1 + np.arange(width)
      pos[i] += ln + len(obs)
    if not active.any():
      break
    logits, cache = segments.extend(
      params, cache, block, block_pos, model_cfg=model_cfg
    )
  return _assemble(
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
  )


def _assemble(
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
) -> MultiTurnRollout:
  """Compacts each row's segments into the [N, T] completion arrays."""
  n, k_max = turn_rewards.shape
  comp = np.full((n, t_total), tokenizer.pad_id, np.int32)
  logp, plogp = (
    np.zeros((n, t_total), np.float32),
    np.zeros((n, t_total), np.float32),
  )
  segment = np.zeros((n, t_total), np.int8)
  turn = np.full((n, t_total), -1, np.int32)
  turn_end = np.full((n, k_max), -1, np.int32)
  num_turns = np.zeros(n, np.int32)
  texts = []
  for i, segs in enumerate(rows):
    c = 0
    for kind, k, ids, lp, plp in segs:
      m = len(ids)
      comp[i, c : c + m] = ids
      segment[i, c : c + m] = kind
      turn[i, c : c + m] = k
      if kind == ACTION:
        logp[i, c : c + m], plogp[i, c : c + m] = lp, plp
        turn_end[i, k] = c + m - 1
        num_turns[i] = k + 1
      c += m
    texts.append(tokenizer.decode(comp[i, :c].tolist()))
  real = segment > 0
  start = positions[:, -1:] + 1
  comp_pos = np.where(real, start + np.cumsum(real, axis=1) - 1, -1)
  mask = (segment == ACTION).astype(np.int32)
  full_tokens = np.concatenate([tokens, comp], axis=1)
  full_pos = np.concatenate([positions, comp_pos.astype(np.int32)], axis=1)
  return MultiTurnRollout(
    tokens=jnp.asarray(full_tokens),
    positions=jnp.asarray(full_pos),
    prompt_len=tokens.shape[1],
    logp=jnp.asarray(logp),
    policy_logp=jnp.asarray(plogp),
    mask=jnp.asarray(mask),
    lengths=mask.sum(-1),
    finish_reasons=np.asarray(finish, str),
    texts=texts,
    prompt_ids=np.repeat(np.arange(n // group_size), group_size),
    segment=segment,
    turn=turn,
    turn_end=turn_end,
    turn_rewards=turn_rewards,
    num_turns=num_turns,
    actions=actions,
    observations=observations,
  )


def make_generate_fn(
  env_factory: Callable[[], Any],
  *,
  max_turns: int,
  turn_tokens: int,
  obs_tokens: int,
  turn_stop_text: str = "\n",
) -> Callable:
  """A context.Context generate_fn that runs `generate` with fresh envs.

  `env_factory()` makes one environment per row, reset on the row's
  example. The turn stop ids are the tokenizer's ids of `turn_stop_text`
  when it encodes to one token (e.g. "\\n" in the char tokenizer).
  """

  def generate_fn(ctx, params, examples, rng, step, *, group_size, sampling):
    tok = ctx.tokenizer
    stop = tok.encode(turn_stop_text) if turn_stop_text else []
    envs = []
    for e in examples:
      for _ in range(group_size):
        env = env_factory()
        env.reset(e)
        envs.append(env)
    return generate(
      params,
      ctx.encode_prompts(examples),
      envs,
      rng,
      step,
      model_cfg=ctx.model_cfg,
      tokenizer=tok,
      max_turns=max_turns,
      turn_tokens=turn_tokens,
      obs_tokens=obs_tokens,
      group_size=group_size,
      sampling=sampling,
      turn_stop_ids=stop if len(stop) == 1 else (),
      max_prompt_len=ctx.cfg.max_prompt_len,
      mesh=ctx.mesh,
    )

  return generate_fn
