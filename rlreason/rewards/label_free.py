"""Label-free rewards: majority vote (TTRL), confidence (RENT, self-certainty)
and format-plus-length surrogate signals.

None of these reads the gold answers (`answers` is accepted and ignored so
they fit the registry signature); `vote_metrics` reads them only to log how
good the majority-vote pseudo-labels are. Completions are grouped
prompt-major: N = B * G, completion i belongs to prompt i // G. EMPO's
semantic clustering is in rewards/semantic.py, RLPR's reference-answer
probability in rewards/likelihood.py.
"""

import collections
from typing import Callable, Sequence

import numpy as np

from rlreason.data import extract
from rlreason.rewards import math as math_lib

ExtractFn = Callable[[str], "str | None"]


def majority_labels(
  completions: Sequence[str],
  group_size: int,
  extract_fn: ExtractFn = extract.extract,
) -> list[str | None]:
  """The most common (normalised) answer of each group, None if no answers.

  Ties go to the answer that appeared first in the group.
  """
  if len(completions) % group_size:
    raise ValueError(f"N={len(completions)} not divisible by G={group_size}")
  labels = []
  for b in range(0, len(completions), group_size):
    votes = collections.Counter()
    for c in completions[b : b + group_size]:
      a = extract_fn(c)
      if a is not None:
        votes[extract.normalize(a)] += 1
    labels.append(votes.most_common(1)[0][0] if votes else None)
  return labels


def majority_vote(
  completions: Sequence[str],
  answers=None,
  *,
  group_size: int,
  extract_fn: ExtractFn = extract.extract,
) -> np.ndarray:
  """TTRL majority-vote reward (Zuo et al. 2025, arXiv 2504.16084).

  The pseudo-label of a prompt is the majority answer among its G samples;
  a sample scores 1 iff its answer equals the pseudo-label.
  Differs from the paper: answers are compared as normalised strings
  (`extract.normalize`), not graded with a math checker against the label,
  which keeps the reward off the verifier pool (G^2 sympy calls otherwise).

  Args:
    completions: N = B * G completions, prompt-major.
    answers: ignored.
    group_size: G.
    extract_fn: final-answer extractor (default: tag / boxed / Answer line;
      pass `tasks.extract_answer` for procedural tasks).
  """
  labels = majority_labels(completions, group_size, extract_fn)
  out = np.zeros(len(completions), np.float32)
  for i, c in enumerate(completions):
    label = labels[i // group_size]
    a = extract_fn(c)
    out[i] = float(a is not None and extract.normalize(a) == label)
  return out


def _masked_mean(x, mask, name: str, n: int) -> np.ndarray:
  x = np.asarray(x, np.float32)
  mask = np.asarray(mask, np.float32)
  if x.ndim != 2 or x.shape != mask.shape or x.shape[0] != n:
    raise ValueError(
      f"{name} and mask must both be [N={n}, T], got {x.shape}, {mask.shape}"
    )
  total = (x * mask).sum(axis=1)
  count = mask.sum(axis=1)
  return np.where(count > 0, total / np.maximum(count, 1.0), 0.0)


def neg_entropy(
  completions: Sequence[str], answers=None, *, token_entropy, mask
) -> np.ndarray:
  """RENT confidence reward (Prabhudesai et al. 2025, arXiv 2505.22660).

      r_i = - sum_t H_{i,t} m_{i,t} / sum_t m_{i,t}

  H is the policy's per-token entropy (computed from the model's logits by
  the caller) and m selects the tokens to score: RENT scores the final-answer
  tokens; a completion mask scores the whole response. Rows with an empty
  mask get 0.

  Args:
    completions: N completions (only their count is used).
    answers: ignored.
    token_entropy: [N, T] per-token entropies in nats.
    mask: [N, T] 1 for scored tokens.
  """
  r = _masked_mean(token_entropy, mask, "token_entropy", len(completions))
  return (-r).astype(np.float32)


def self_certainty(
  completions: Sequence[str], answers=None, *, token_self_certainty, mask
) -> np.ndarray:
  """Self-certainty reward (Intuitor, Zhao et al. 2025, arXiv 2505.19590).

  The masked mean of per-token self-certainty KL(U || p_t) = -log V -
  (1/V) sum_v log p_t(v), computed by the caller from the logits.

  Args:
    token_self_certainty: [N, T].
    mask: [N, T].
  """
  r = _masked_mean(
    token_self_certainty, mask, "token_self_certainty", len(completions)
  )
  return r.astype(np.float32)


def length_score(lengths, max_length, peak: float = 0.5) -> np.ndarray:
  """The Format-Length length curve f(x; p), x = L / Lmax.

      f = 1 - (1 - x/p)^2            for x <= p   (rises to 1 at x = p)
      f = 1 - 2 ((x - p)/(1 - p))^2  for x > p    (falls to -1 at x = 1)

  As in the authors' code (insightLLM/rl-without-gt `length_reward_func_v3`).
  """
  x = np.asarray(lengths, np.float32) / max_length
  rising = 1.0 - (1.0 - x / peak) ** 2
  falling = 1.0 - 2.0 * ((x - peak) / (1.0 - peak)) ** 2
  return np.where(x <= peak, rising, falling).astype(np.float32)


def format_length(
  completions: Sequence[str],
  answers=None,
  *,
  lengths,
  max_length,
  peak: float = 0.5,
  length_weight: float = 1.0,
) -> np.ndarray:
  """Format-Length surrogate reward (Xin et al. 2025, arXiv 2505.19439).

      format = 0.5 * [has <think>...</think>] + 0.5 * [answer extractable]
      R = format + w * f(L)       if an answer is extractable
        = min(0, w * f(L))        otherwise

  `length_weight=0` gives the format-only phase of the paper. Follows the
  authors' code (Lmax=3072, p=0.5 there). Differs: their answer check also
  requires the answer to parse with sympy; here it must be extractable and
  pass the verifier pre-filter (no sympy on this path).
  """
  n = len(completions)
  lengths = np.asarray(lengths, np.float32)
  if lengths.shape != (n,):
    raise ValueError(f"lengths must be [{n}], got {lengths.shape}")
  f = length_weight * length_score(lengths, max_length, peak)
  think = think_block(completions)
  out = np.zeros(n, np.float32)
  for i, c in enumerate(completions):
    a = extract.extract(c)
    has_answer = bool(a) and math_lib.prefilter(a)
    if has_answer:
      out[i] = 0.5 * think[i] + 0.5 + f[i]
    else:
      out[i] = min(0.0, f[i])
  return out


def think_block(completions: Sequence[str]) -> np.ndarray:
  """[N] 1 iff a `<think>` is later closed by `</think>` (soft format).

  The authors' soft_format_reward_func_v2 (regex <think>.*?</think>).
  """
  out = np.zeros(len(completions), np.float32)
  for i, c in enumerate(completions):
    start = c.find("<think>")
    out[i] = start >= 0 and c.find("</think>", start) >= 0
  return out


def vote_metrics(votes, correct, group_size: int) -> dict[str, float]:
  """How good the majority-vote pseudo-labels are (TTRL's diagnostics).

  Args:
    votes: [N] 0/1, 1 where a completion's answer is its group's majority
      answer (the `majority_vote` reward), N = B * G prompt-major.
    correct: [N] 0/1 correctness against the gold answers (for logging
      only; the reward never sees them).
    group_size: G.

  Returns:
    label_accuracy: fraction of prompts whose majority answer is correct
      (maj@G); a prompt with no extractable answer has a wrong label.
      The completions voting for the label all carry it, so the label is
      correct iff one of them is.
    reward_accuracy: fraction of completions whose pseudo-reward equals
      their true reward (TTRL's "reward accuracy").
    majority_ratio: mean share of a group that votes for its label.
  """
  votes = np.asarray(votes, np.float32).reshape(-1, group_size) > 0
  correct = np.asarray(correct, np.float32).reshape(-1, group_size) > 0
  label_ok = (votes & correct).any(-1)
  return {
    "label_accuracy": float(label_ok.mean()),
    "reward_accuracy": float((votes == correct).mean()),
    "majority_ratio": float(votes.mean()),
  }
