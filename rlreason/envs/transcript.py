"""The arrays of a multi-turn rollout: each row's turns (action and
observation segments) compacted into [N, T] completion columns beside the
prompt, with the turn bookkeeping the turn-level credit reads.

  ro = transcript.assemble(tokens, positions, rows, t_total, ...)

Shapes: N rows, P prompt length, K turns, T = completion_budget(K, Tt, O).
multiturn.py runs the episodes; this is what they leave.
"""

from typing import NamedTuple

import jax
import numpy as np

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


def completion_budget(max_turns: int, turn_tokens: int, obs_tokens: int):
  """T, the completion columns of an episode: K actions of up to Tt tokens
  and the K - 1 observations of up to O between them."""
  return max_turns * turn_tokens + (max_turns - 1) * obs_tokens


def assemble(
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
) -> MultiTurnRollout:
  """Compacts each row's segments into the [N, T] completion arrays (put
  on device by `rows_on`, in the rollout batch sharding)."""
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
  full_tokens, full_pos, logp, plogp, mask_dev = rows_on(
    (full_tokens, full_pos, logp, plogp, mask)
  )
  return MultiTurnRollout(
    tokens=full_tokens,
    positions=full_pos,
    prompt_len=tokens.shape[1],
    logp=logp,
    policy_logp=plogp,
    mask=mask_dev,
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
