"""Turn-level credit for multi-turn rollouts: information gain, turn
advantages spread to tokens.

IGPO (Wang et al. 2025, "Information Gain-based Policy Optimization",
arXiv:2510.14967): the reward of turn t is the gain in the policy's
probability of the gold answer once turn t's observation is in context,

  r_t = p(a | q, o_<=t) - p(a | q, o_<=t-1),    the last turn: outcome

then all turn rewards of a group are normalised together and each turn's
advantage is the discounted sum of the normalised rewards from it on.

Shapes: N rows, K max turns, T completion length (multiturn.py).
"""

import numpy as np

from rlreason.sampling import padding

NORM_MODES = ("joint", "separate")  # turn_advantages' norm_mode


def turn_token_rewards(
  turn_rewards: np.ndarray, turn_end: np.ndarray, t: int
) -> np.ndarray:
  """[N, K] turn rewards -> [N, T] token rewards on each turn's last token.

  Feed them to returns.gae / reinforce_plus_plus (token_rewards=...)
  with the action mask: observation spans (mask 0) carry returns through.
  """
  out = np.zeros((turn_rewards.shape[0], t), np.float32)
  rows, turns = np.nonzero(turn_end >= 0)
  np.add.at(out, (rows, turn_end[rows, turns]), turn_rewards[rows, turns])
  return out


def answer_prob_at_turns(
  score,
  rollout,
  answers: list[str],
  *,
  tokenizer,
  answer_format: str = "answer: {}",
) -> np.ndarray:
  """p(answer | prompt + completion up to the start of turn k), [N, K].

  Column k conditions on everything before turn k's action (k = 0: the
  prompt alone), followed by `answer_format.format(answer)`. p is the
  geometric-mean probability of the gold answer's own tokens,
  exp(mean log-prob) over them: the format's words around the answer are
  context, not scored (the authors' generation.py scores the tokens that
  cover the ground truth's characters; gold_span). Turns not taken are 0.

  `score(tokens, positions, prompt_len)` is the policy's [M, T] log-probs
  of the M <= N * K sequences' last T tokens on the host: at scale, one
  micro-batch of rows per forward (Context.completion_scores), never all M
  at once.
  """
  n, k_max = rollout.turn_end.shape
  p = rollout.prompt_len
  tokens = np.asarray(rollout.tokens)
  positions = np.asarray(rollout.positions)
  turn = rollout.turn
  seqs, where = [], []
  for i in range(n):
    ans, (lo, hi) = gold_span(tokenizer, answer_format, answers[i])
    real = tokens[i, :p][positions[i, :p] >= 0].tolist()
    for k in range(int(rollout.num_turns[i])):
      cut = int(np.argmax(turn[i] == k))  # first column of turn k
      seqs.append(real + tokens[i, p : p + cut].tolist() + ans)
      # The gold tokens, counted from the sequence's end.
      where.append((i, k, len(ans) - lo, len(ans) - hi))
  out = np.zeros((n, k_max), np.float32)
  if not seqs:
    return out
  # Right-aligned answers: left padding puts every answer at the end.
  toks, pos = padding.pad_prompts(seqs, tokenizer.pad_id, bucket=16)
  a_max = max(a for _, _, a, _ in where)
  logp = np.asarray(score(toks, pos, toks.shape[1] - a_max))
  for row, (i, k, a, b) in enumerate(where):
    if a > b:  # an empty gold answer has no probability to gain
      out[i, k] = np.exp(logp[row, a_max - a : a_max - b].mean())
  return out


def gold_span(tokenizer, answer_format: str, answer: str):
  """(tokens of answer_format.format(answer), (lo, hi)): tokens[lo:hi] are
  the ones that cover the answer's characters.

  The whole text is encoded at once (a BPE token may join the format's
  space to the answer's first word); the span is what is left after the
  longest common start with the format's text before the answer and the
  longest common end with the text after it: a token that merges format
  and answer characters counts as the answer's, as an offset mapping would
  place it.
  """
  before, _, after = answer_format.partition("{}")
  ids = tokenizer.encode(answer_format.format(answer))
  lo = _common(ids, tokenizer.encode(before) if before else [])
  hi = len(ids) - _common(
    ids[lo:][::-1], tokenizer.encode(after)[::-1] if after else []
  )
  return ids, (lo, hi)


def _common(a, b) -> int:
  """Length of the longest common start of two token lists."""
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return n


def information_gain_rewards(
  probs: np.ndarray, outcome: np.ndarray, num_turns: np.ndarray
) -> np.ndarray:
  """[N, K] turn rewards: p_{k+1} - p_k for k < n - 1; outcome at n - 1."""
  n, k_max = probs.shape
  r = np.zeros((n, k_max), np.float32)
  for i in range(n):
    last = int(num_turns[i]) - 1
    if last < 0:
      continue
    r[i, :last] = probs[i, 1 : last + 1] - probs[i, :last]
    r[i, last] = outcome[i]
  return r


def turn_advantages(
  turn_rewards: np.ndarray,
  num_turns: np.ndarray,
  group_size: int,
  *,
  gamma: float = 1.0,
  eps: float = 1e-6,
  norm_mode: str = "joint",
) -> np.ndarray:
  """Group-normalised turn rewards, discounted-summed from each turn on.

  IGPO: norm(r) = (r - mean) / (std + eps) with the authors' std (their
  core_algos.py): sqrt(population variance + 1e-8), 1 over a single value;
  A_k = sum_{j >= k} gamma^(j - k) norm(r_j). norm_mode "joint" (the
  paper's) takes mean / std over every taken turn of every row of the
  group; "separate" (the authors' later option) takes the outcomes (each
  row's last turn) and the information gains (the turns before it) apart,
  so a group whose outcomes are all equal gives its last turns 0, as GRPO
  would, instead of the difference from the mean gain.
  """
  if norm_mode not in NORM_MODES:
    raise ValueError(f"norm_mode={norm_mode!r}; one of {NORM_MODES}")
  n, k_max = turn_rewards.shape
  cols = np.arange(k_max)[None]
  taken = cols < num_turns[:, None]
  if norm_mode == "joint":
    parts = [taken]
  else:  # the outcome, then the information gains
    last = cols == num_turns[:, None] - 1
    parts = [last, taken & ~last]
  norm = np.zeros_like(turn_rewards, dtype=np.float32)
  for g in range(n // group_size):
    rows = slice(g * group_size, (g + 1) * group_size)
    for part in parts:
      vals = turn_rewards[rows][part[rows]]
      if vals.size == 0:
        continue
      std = np.sqrt(vals.var() + 1e-8) if vals.size > 1 else 1.0
      norm[rows] = np.where(
        part[rows], (turn_rewards[rows] - vals.mean()) / (std + eps), norm[rows]
      )
  adv = np.zeros_like(norm)
  acc = np.zeros(n, np.float32)
  for k in reversed(range(k_max)):
    acc = np.where(taken[:, k], norm[:, k] + gamma * acc, 0.0)
    adv[:, k] = acc
  return adv


def spread_to_tokens(
  turn_adv: np.ndarray, turn: np.ndarray, mask: np.ndarray
) -> np.ndarray:
  """[N, K] turn advantages -> [N, T] on each turn's action tokens."""
  idx = np.clip(turn, 0, turn_adv.shape[1] - 1)
  out = np.take_along_axis(turn_adv, idx, axis=1)
  return np.where((np.asarray(mask) > 0) & (turn >= 0), out, 0.0).astype(
    np.float32
  )
