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
little signal and are dropped; the threshold is half an exponential
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

  On step t:
      keep_b = std_b >= scale * ema    from t = filter_start on (else all)
      ema <- m * ema + (1 - m) * mean_b std_b    from t = ema_start on
  (the first such step seeds ema with its mean std); the threshold a step
  applies comes from the steps before it, and the mean runs over every
  group the step sampled, in all its rounds (the authors refill a batch
  until it is full: their trainer's score_std_list). The authors' defaults
  (OpenBMB/RLPR's script: filter_ema_ratio 0.99, std_filter_beta 0.5,
  filter_ema_start_step 6, filter_start_step 11); before filter_start the
  authors filter nothing, groups of std 0 (advantage 0) included. `state`
  / `restore` carry it over a resumed run
  (difficulty.tracked_iterator checkpoints it with the data's position).

  Args:
    momentum: m.
    scale: the threshold's fraction of the average.
    ema_start: the first step whose stds enter the average.
    filter_start: the first step filtered by the threshold.
  """

  def __init__(
    self,
    momentum: float = 0.99,
    scale: float = 0.5,
    ema_start: int = 6,
    filter_start: int = 11,
  ):
    if not 0 <= momentum < 1:
      raise ValueError(f"momentum={momentum} not in [0, 1)")
    if not scale >= 0 or ema_start < 1 or filter_start < 1:
      raise ValueError(
        f"need scale >= 0 and starts >= 1: {scale}, {ema_start}, {filter_start}"
      )
    self.momentum, self.scale = momentum, scale
    self.ema_start, self.filter_start = ema_start, filter_start
    self.step = 0  # steps closed
    self.ema = None
    self._open = None  # the step whose rounds `_stds` holds
    self._stds = []

  @property
  def filtering(self) -> bool:
    """Whether the step being sampled is filtered."""
    return self.ema is not None and self.step + 1 >= self.filter_start

  @property
  def threshold(self) -> float:
    """The std a group needs on the step being sampled (0 before
    filtering)."""
    return self.scale * self.ema if self.filtering else 0.0

  def __call__(
    self, rewards: np.ndarray, group_size: int, step: int | None = None
  ) -> np.ndarray:
    """[B] bool: groups to keep. rewards [N], N = B * G prompt-major.

    Calls with the same `step` are rounds of one step (one threshold, one
    update of the average); a call with another step, or None, closes the
    step before it.
    """
    if step is None or step != self._open:
      self._close()
      self._open = step
    std = np.asarray(rewards, np.float64).reshape(-1, group_size).std(-1)
    self._stds.extend(std.tolist())
    if not self.filtering:
      return np.ones(len(std), bool)
    return std >= self.threshold

  def _close(self) -> None:
    if not self._stds:
      return
    self.step += 1
    if self.step >= self.ema_start:
      mean = float(np.mean(self._stds))
      self.ema = (
        mean
        if self.ema is None
        else self.momentum * self.ema + (1 - self.momentum) * mean
      )
    self._stds = []

  def state(self) -> dict:
    return {
      "step": self.step,
      "ema": self.ema,
      "open": self._open,
      "stds": list(self._stds),
    }

  def restore(self, state: dict) -> None:
    self.step, self.ema = int(state["step"]), state["ema"]
    self._open, self._stds = state["open"], list(state["stds"])
