"""Verifier-free rewards from the policy's likelihood of the reference answer.

RLPR (Yu et al. 2025, "RLPR: Extrapolating RLVR to General Domains without
Verifiers", arXiv:2506.18254). For prompt x, the policy's reasoning z (its
completion up to the final answer) and the reference answer y* with tokens
y*_1..y*_A, the probability reward is the MEAN per-token probability

    r = (1/A) sum_a pi(y*_a | x, z, y*_<a)

(the mean of probabilities, not the sequence probability: one unlikely
token does not zero the reward). Debiasing subtracts the same
score without reasoning, r' = mean_a pi(y*_a | x, y*_<a), so the reward
credits what the reasoning adds:

    r_hat = clip(r - r', 0, 1)

Std filtering: prompts whose G rewards barely differ carry
little signal and are dropped; the threshold beta follows an exponential
moving average of the batch's mean group std (`StdFilter`).

The log-probs come from self_scoring.reference_logprobs (host side).
"""

import numpy as np


def mean_token_prob(logp: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[N] mean over the masked tokens of exp(logp); 0 for empty rows.

  Args:
    logp: [N, A] log-probs of the reference tokens.
    mask: [N, A] 1 on reference tokens.
  """
  logp = np.asarray(logp, np.float64)
  mask = np.asarray(mask, np.float64)
  count = mask.sum(-1)
  total = (np.exp(logp) * mask).sum(-1)
  return np.where(count > 0, total / np.maximum(count, 1), 0.0).astype(
    np.float32
  )


def debiased(prob: np.ndarray, baseline: np.ndarray) -> np.ndarray:
  """RLPR's debiased reward clip(r - r', 0, 1). Both [N]."""
  prob = np.asarray(prob, np.float32)
  baseline = np.asarray(baseline, np.float32)
  return np.clip(prob - baseline, 0.0, 1.0).astype(np.float32)


class StdFilter:
  """RLPR std filtering with an EMA threshold (stateful, host side).

      keep_b = std_b >= beta,   then   beta <- m * beta + (1 - m) * mean_b std_b

  The first call keeps every group with std > 0 (beta starts at `init`
  unless given) and seeds the average with that batch's mean std.
  The state is in memory: a resumed run restarts the average.

  Args:
    momentum: m.
    init: the threshold before any batch (None: the first batch's mean
      std seeds the average; that batch is filtered at 0).
  """

  def __init__(self, momentum: float = 0.99, init: float | None = None):
    if not 0 <= momentum < 1:
      raise ValueError(f"momentum={momentum} not in [0, 1)")
    self.momentum = momentum
    self.beta = init

  def __call__(self, rewards: np.ndarray, group_size: int) -> np.ndarray:
    """[B] bool: groups to keep. rewards [N], N = B * G prompt-major."""
    std = np.asarray(rewards, np.float64).reshape(-1, group_size).std(-1)
    if self.beta is None:
      keep = std > 0
      self.beta = float(std.mean())
    else:
      keep = (std >= self.beta) & (std > 0)
      self.beta = float(
        self.momentum * self.beta + (1 - self.momentum) * std.mean()
      )
    return keep
