"""Confidence-weighted, clipped verifiable reward (ConfClip's mechanism).

ConfClip (Zhang et al. 2025, arXiv:2509.17730) combines the binary
verifiable outcome o_i in {0, 1} with the policy's own confidence in its
answer, and clips the confidence, so that (a) the reward is finer-grained
than 0/1 and (b) a group whose G samples are all right (or all wrong) still
has reward variance, hence a gradient under GRPO's group normalisation.

Our reading (the abstract's "confidence-weighted and clipped reward"; the
paper's exact formula was not in any source we could reach, so this form
is ours and its constants are flags):

  c_i  = exp( sum_t m_it log pi(y_it) / sum_t m_it )   geometric-mean
                                                        probability of the
                                                        scored tokens
  c~_i = clip(c_i, c_lo, c_hi)
  r_i  = o_i (1 + w c~_i) - (1 - o_i) w c~_i

A confident correct answer earns more than a hesitant one; a confident
wrong answer is punished more than a hesitant one. The worst correct
reward, 1 + w c_lo, is at least 1 and the best wrong reward, -w c_lo, at most
0, so correctness always dominates confidence; the clip bounds how far
confidence moves a reward and keeps it off the saturated end c -> 1, which
the policy could otherwise chase.
"""

import numpy as np


def confidence(token_logp, mask) -> np.ndarray:
  """[N] geometric-mean token probability exp(mean_t log p) over `mask`.

  Args:
    token_logp: [N, T] log-probs of the sampled tokens under the policy.
    mask: [N, T] 1 for scored tokens. Rows with an empty mask get 0.
  """
  logp = np.asarray(token_logp, np.float64)
  mask = np.asarray(mask, np.float64)
  if logp.ndim != 2 or logp.shape != mask.shape:
    raise ValueError(
      f"token_logp and mask must both be [N, T], got {logp.shape}, {mask.shape}"
    )
  count = mask.sum(axis=1)
  mean = (logp * mask).sum(axis=1) / np.maximum(count, 1.0)
  return np.where(count > 0, np.exp(mean), 0.0).astype(np.float32)


def confclip(
  correct, conf, *, weight: float, clip_low: float, clip_high: float
) -> np.ndarray:
  """[N] r = o (1 + w c~) - (1 - o) w c~, c~ = clip(conf, lo, hi).

  Args:
    correct: [N] verifier outcomes in {0, 1}.
    conf: [N] confidences in [0, 1] (`confidence`).
    weight: w >= 0; 0 gives the plain 0/1 reward.
    clip_low, clip_high: 0 <= lo <= hi <= 1.
  """
  if not 0.0 <= clip_low <= clip_high <= 1.0:
    raise ValueError(
      f"need 0 <= clip_low <= clip_high <= 1, got {clip_low}, {clip_high}"
    )
  if weight < 0:
    raise ValueError(f"weight must be >= 0, got {weight}")
  o = np.asarray(correct, np.float32)
  c = np.clip(np.asarray(conf, np.float32), clip_low, clip_high)
  if o.shape != c.shape:
    raise ValueError(f"correct {o.shape} and conf {c.shape} differ")
  return (o * (1.0 + weight * c) - (1.0 - o) * weight * c).astype(np.float32)
