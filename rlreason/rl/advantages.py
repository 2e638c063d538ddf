"""Sequence-level advantage estimators for RL of language models.

Shapes: B prompts, G completions per prompt, N = B * G sequences, T completion
length. Outcome rewards arrive flat as `rewards` [N], each prompt's G
completions contiguous (rollout.py guarantees it).

Estimators are computed on WHOLE groups, before any minibatch split. They
return [N] (one advantage per sequence, broadcast over its tokens by the
loss). Token-level estimators (REINFORCE++, GAE), which return [N, T], live
in returns.py.

Edge cases, the same for every group estimator:
  * an all-equal group gets exactly zero advantage (never NaN, never noise
    divided by a tiny std);
  * `valid` [N] (optional) drops unscorable completions: they get zero
    advantage and are excluded from the group statistics (TRL's NaN rewards);
  * a singleton group (G == 1, or one valid member) has no baseline to
    compare against and gets zero advantage. Deviation: verl's loop versions
    use mean 0 / std 1 for singletons (A = r); its vectorized RLOO gives 0.

`get(name)` returns an estimator by the name experiment flags use
(`--advantage`); `returns.get` has the token-level ones. Experiment files
bind the remaining arguments with functools.partial.
"""

import functools
from typing import Callable

import chex
import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln


def _safe_div(x: jax.Array, d: jax.Array) -> jax.Array:
  """x / d with d == 0 treated as 1 (x is 0 wherever that happens here)."""
  return x / jnp.where(d > 0, d, 1.0)


def _grouped(
  rewards: jax.Array, group_size: int, valid: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
  """[N] rewards (and validity) -> [B, G] float arrays."""
  chex.assert_rank(rewards, 1)
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(
      f"{rewards.shape[0]} rewards do not split into groups of {group_size}."
    )
  r = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
  if valid is None:
    v = jnp.ones_like(r)
  else:
    chex.assert_equal_shape([rewards, valid])
    v = jnp.asarray(valid, jnp.float32).reshape(-1, group_size)
  return r, v


def _centered(
  r: jax.Array, v: jax.Array, baseline: jax.Array | None = None
) -> jax.Array:
  """r - baseline ([B, G]), exactly 0 for invalid entries and constant groups.

  The exact zero matters: mean() of equal floats can differ from them in the
  last bit, and that noise divided by (std + eps) is not small.
  """
  valid = v > 0
  if baseline is None:  # the group mean over valid members
    baseline = _safe_div(
      (r * v).sum(-1, keepdims=True), v.sum(-1, keepdims=True)
    )
  hi = jnp.where(valid, r, -jnp.inf).max(-1, keepdims=True)
  lo = jnp.where(valid, r, jnp.inf).min(-1, keepdims=True)
  return jnp.where(valid & (hi > lo), r - baseline, 0.0)


def _std(centered: jax.Array, v: jax.Array, ddof: int) -> jax.Array:
  """Std over the last axis of valid, already-centered values ([B, 1])."""
  n = v.sum(-1, keepdims=True)
  var = (centered**2).sum(-1, keepdims=True) / jnp.maximum(n - ddof, 1.0)
  return jnp.sqrt(var)


def group_normalized(
  rewards: jax.Array,
  group_size: int,
  *,
  scale_by_std: bool = True,
  ddof: int = 1,
  eps: float = 1e-6,
  valid: jax.Array | None = None,
) -> jax.Array:
  """Reward minus its group mean, optionally divided by the group std.

  GRPO (Shao et al. 2024, arXiv:2402.03300):
    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)
  Dr. GRPO (Liu et al. 2025, arXiv:2503.20783), scale_by_std=False:
    A_i = r_i - mean_g(r)

  The std is Bessel-corrected (ddof=1) like torch.std in verl/TRL/OpenRLHF/oat;
  the papers do not say. eps differs across frameworks: verl 1e-6 (default
  here), TRL 1e-4, oat 1e-8, OpenRLHF 1e-9 (research/peers.md Sec. 2.2).

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    group_size: G.
    scale_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
    ddof: delta degrees of freedom of the std.
    eps: added to the std.
    valid: optional [N] bool; invalid completions get 0 and are excluded from
      the group mean and std.

  Returns:
    [N] advantages, zero-mean over the valid members of each group.
  """
  r, v = _grouped(rewards, group_size, valid)
  adv = _centered(r, v)
  if scale_by_std:
    adv = _safe_div(adv, _std(adv, v, ddof) + eps)
  return adv.reshape(-1)


def batch_std_normalized(
  rewards: jax.Array,
  group_size: int,
  *,
  ddof: int = 1,
  eps: float = 1e-6,
  valid: jax.Array | None = None,
) -> jax.Array:
  """Reward minus its group mean, divided by the std of the whole batch.

  "Tricks or Traps" Part I (Liu et al. 2025, arXiv:2508.08221), the
  normalisation of Lite PPO; TRL's scale_rewards="batch":
    A_i = (r_i - mean_g(r)) / (std_batch(r) + eps)
  The batch std is over the raw rewards of all valid completions.

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    group_size: G.
    ddof: delta degrees of freedom of the batch std (TRL: 1).
    eps: added to the std (TRL: 1e-4).
    valid: optional [N] bool, as in `group_normalized`.

  Returns:
    [N] advantages, zero-mean over the valid members of each group.
  """
  r, v = _grouped(rewards, group_size, valid)
  adv = _centered(r, v)
  flat_v = v.reshape(1, -1)
  batch_std = _std(_centered(r.reshape(1, -1), flat_v), flat_v, ddof)
  return _safe_div(adv, batch_std + eps).reshape(-1)


def leave_one_out(
  rewards: jax.Array,
  group_size: int,
  *,
  valid: jax.Array | None = None,
) -> jax.Array:
  """Reward minus the mean reward of the other members of its group (RLOO).

  RLOO (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740):
    A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean_g(r))
  with n the number of valid members of the group.

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    group_size: G.
    valid: optional [N] bool, as in `group_normalized`.

  Returns:
    [N] advantages, zero-mean within each group.
  """
  r, v = _grouped(rewards, group_size, valid)
  n = v.sum(-1, keepdims=True)
  return (_centered(r, v) * n / jnp.maximum(n - 1.0, 1.0)).reshape(-1)


def length_weighted(
  rewards: jax.Array,
  lengths: jax.Array,
  group_size: int,
  *,
  valid: jax.Array | None = None,
) -> jax.Array:
  """Reward minus the length-weighted group mean reward (OPO).

  OPO (Hao et al. 2025, arXiv:2505.23585), the optimal baseline under
  sequence-level gradients:
    A_i = r_i - sum_j |o_j| r_j / sum_j |o_j|
  A group whose lengths are all zero falls back to the plain mean.

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    lengths: [N] completion lengths |o_i| (e.g. mask.sum(-1)).
    group_size: G.
    valid: optional [N] bool, as in `group_normalized`.

  Returns:
    [N] advantages; sum_i |o_i| A_i = 0 within each group.
  """
  r, v = _grouped(rewards, group_size, valid)
  chex.assert_equal_shape([rewards, lengths])
  w = jnp.asarray(lengths, jnp.float32).reshape(r.shape) * v
  w = jnp.where(w.sum(-1, keepdims=True) > 0, w, v)
  baseline = _safe_div((w * r).sum(-1, keepdims=True), w.sum(-1, keepdims=True))
  return _centered(r, v, baseline).reshape(-1)


def gpg_scaled(
  rewards: jax.Array,
  group_size: int,
  *,
  scale_by_std: bool = False,
  ddof: int = 1,
  eps: float = 1e-6,
  alpha_count: str = "nonconstant_groups",
  valid: jax.Array | None = None,
) -> jax.Array:
  """Group-centered reward, rescaled by the inverse fraction of useful samples.

  GPG (Chu et al. 2025, arXiv:2504.02546, "accurate gradient
  estimation"):
    A_i = alpha * (r_i - mean_g(r)) / F_norm,   alpha = B / (B - M)
  with B the batch size and M the number of samples in all-equal groups
  (which carry no gradient). F_norm = 1 by default (scale_by_std=False), or
  the group std + eps.

  alpha_count="nonzero_rewards" is verl's variant: alpha = N / #{r_i != 0}.

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    group_size: G.
    scale_by_std: F_norm = group std + eps instead of 1.
    ddof: delta degrees of freedom of the std.
    eps: added to the std.
    alpha_count: "nonconstant_groups" (paper) or "nonzero_rewards" (verl).
    valid: optional [N] bool, as in `group_normalized`.

  Returns:
    [N] advantages, zero-mean within each group.
  """
  r, v = _grouped(rewards, group_size, valid)
  adv = group_normalized(
    rewards,
    group_size,
    scale_by_std=scale_by_std,
    ddof=ddof,
    eps=eps,
    valid=valid,
  )
  if alpha_count == "nonconstant_groups":
    hi = jnp.where(v > 0, r, -jnp.inf).max(-1, keepdims=True)
    lo = jnp.where(v > 0, r, jnp.inf).min(-1, keepdims=True)
    useful = (v * (hi > lo)).sum()
  elif alpha_count == "nonzero_rewards":
    useful = (v * (r != 0)).sum()
  else:
    raise ValueError(f"Unknown alpha_count: {alpha_count!r}")
  alpha = v.sum() / jnp.maximum(useful, 1.0)
  return alpha * adv


def pass_at_k(rewards: jax.Array, group_size: int, *, k: int) -> jax.Array:
  """Analytic advantage of the group's pass@k reward (binary rewards).

  Pass@k Training (Chen et al. 2025, arXiv:2508.10751): with n = G
  samples of which n_neg failed, the expected pass@k reward of a random
  k-subset, its std, and the advantages of a correct / failed sample:
    R = 1 - C(n_neg, k) / C(n, k),    s = sqrt(R (1 - R))
    A_pos = (1 - R) / s
    A_neg = (1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / s
  k = 1 recovers GRPO with the population (ddof=0) std.

  Args:
    rewards: [N] rewards in {0, 1} (> 0.5 counts as correct).
    group_size: G (= n).
    k: subset size, 1 <= k <= G.

  Returns:
    [N] advantages; 0 for all-correct and all-wrong groups.
  """
  if not 1 <= k <= group_size:
    raise ValueError(f"pass_at_k needs 1 <= k <= {group_size}, got {k}.")
  r, _ = _grouped(rewards, group_size, None)
  correct = r > 0.5
  n = float(group_size)
  n_neg = group_size - correct.sum(-1, keepdims=True).astype(jnp.float32)

  def comb_ratio(a, b, j):  # C(a, j) / C(b, j), 0 when a < j; b >= j static.
    a_safe = jnp.maximum(a, j)
    log = (
      gammaln(a_safe + 1)
      - gammaln(a_safe - j + 1)
      - gammaln(b + 1)
      + gammaln(b - j + 1)
    )
    return jnp.where(a >= j, jnp.exp(log), 0.0)

  mean = 1.0 - comb_ratio(n_neg, n, k)
  std = jnp.sqrt(mean * (1.0 - mean))
  a_pos = _safe_div(1.0 - mean, std)
  a_neg = _safe_div(1.0 - mean - comb_ratio(n_neg - 1, n - 1, k - 1), std)
  adv = jnp.where(correct, a_pos, a_neg)
  return jnp.where(std > 0, adv, 0.0).reshape(-1)


def max_minus_second(
  rewards: jax.Array,
  group_size: int,
  *,
  scale_by_std: bool = False,
  ddof: int = 1,
  eps: float = 1e-6,
) -> jax.Array:
  """Only the group's best sample is credited, by its margin over the second.

  Pass@k / best-of-n objective (Tang et al. 2025, arXiv:2503.19595), verl's
  `grpo_passk`:
    A_argmax = r_max - r_second,   A_i = 0 otherwise
  verl also divides by the group std + eps (scale_by_std=True, its default).
  Ties give 0 (the margin is 0).

  Args:
    rewards: [N] scalar reward per completion, groups contiguous.
    group_size: G >= 2.
    scale_by_std: divide the margin by the group std + eps (verl).
    ddof: delta degrees of freedom of the std.
    eps: added to the std.

  Returns:
    [N] advantages, nonzero for at most one sample per group.
  """
  if group_size < 2:
    raise ValueError("max_minus_second needs group_size >= 2.")
  r, v = _grouped(rewards, group_size, None)
  top2, _ = jax.lax.top_k(r, 2)  # [B, 2]
  margin = top2[:, :1] - top2[:, 1:]
  if scale_by_std:
    margin = _safe_div(margin, _std(_centered(r, v), v, ddof) + eps)
  is_best = jnp.arange(group_size)[None, :] == jnp.argmax(
    r, axis=-1, keepdims=True
  )
  return jnp.where(is_best, margin, 0.0).reshape(-1)


_REGISTRY: dict[str, Callable[..., jax.Array]] = {
  "grpo": group_normalized,
  "dr_grpo": functools.partial(group_normalized, scale_by_std=False),
  "lite_ppo": batch_std_normalized,
  "rloo": leave_one_out,
  "opo": length_weighted,
  "gpg": gpg_scaled,
  "pass_at_k": pass_at_k,
  "max_minus_second": max_minus_second,
}


def names() -> tuple[str, ...]:
  """The names `get` accepts."""
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Callable[..., jax.Array]:
  """Returns the advantage estimator registered under `name`.

  Signatures: (rewards [N], group_size, ...); `opo`: (rewards, lengths,
  group_size).

  Raises:
    ValueError: for an unknown name, listing the valid ones (and where the
      token-level estimators are).
  """
  if name not in _REGISTRY:
    raise ValueError(
      f"Unknown advantage estimator {name!r}; valid names: {names()} "
      "(token-level estimators: returns.get)."
    )
  return _REGISTRY[name]
