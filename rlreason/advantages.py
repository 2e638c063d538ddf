"""Advantage estimators for RL of language models.

Shapes: B prompts, G completions per prompt, N = B * G sequences, T completion
length. Outcome rewards arrive flat as `rewards` [N], each prompt's G
completions contiguous (rollout.py guarantees it). Per-token arrays are [N, T]
with `mask` [N, T] (1 = completion token; 0 = prompt padding, observation
tokens of a multi-turn episode, or padding after EOS).

Estimators are computed on WHOLE groups, before any minibatch split. Group
estimators return [N] (one advantage per sequence, broadcast over its tokens
by the loss); token estimators (REINFORCE++, GAE) return [N, T].

Edge cases, the same for every group estimator:
  * an all-equal group gets exactly zero advantage (never NaN, never noise
    divided by a tiny std);
  * `valid` [N] (optional) drops unscorable completions: they get zero
    advantage and are excluded from the group statistics (TRL's NaN rewards);
  * a singleton group (G == 1, or one valid member) has no baseline to
    compare against and gets zero advantage. Deviation: verl's loop versions
    use mean 0 / std 1 for singletons (A = r); its vectorized RLOO gives 0.

`get(name)` returns an estimator by the name experiment flags use. The
estimators take different inputs (a GAE needs values), so experiment files
bind the rest with functools.partial.
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


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """Places each sequence's scalar reward on its last completion token.

  Args:
    rewards: [N] scalar reward per completion.
    mask: [N, T] completion-token mask.

  Returns:
    [N, T] token rewards, zero except at the last mask = 1 token of each
    (non-empty) sequence.
  """
  chex.assert_rank([rewards, mask], [1, 2])
  t = mask.shape[-1]
  m = mask > 0
  last = t - 1 - jnp.argmax(m[:, ::-1], axis=-1)  # [N]
  at_last = (jnp.arange(t)[None, :] == last[:, None]) & m.any(-1, keepdims=True)
  return jnp.where(at_last, jnp.asarray(rewards, jnp.float32)[:, None], 0.0)


def whiten(
  x: jax.Array, mask: jax.Array, *, ddof: int = 1, eps: float = 1e-8
) -> jax.Array:
  """Shift and scale to zero mean and unit variance over all valid tokens.

    whiten(x) = (x - mean) / sqrt(var + eps),  over {mask = 1} in the batch

  As verl's masked_whiten (unbiased var, ddof=1, eps inside the sqrt).
  OpenRLHF uses the population variance and max(var, eps); oat 1e-8 too.
  An all-equal input gives zeros.

  Args:
    x: [N, T] values.
    mask: [N, T] tokens that count.
    ddof: delta degrees of freedom of the variance.
    eps: added to the variance.

  Returns:
    [N, T] whitened values, 0 where mask = 0.
  """
  chex.assert_equal_shape([x, mask])
  v = jnp.asarray(mask, jnp.float32).reshape(1, -1)
  c = _centered(jnp.asarray(x, jnp.float32).reshape(1, -1), v)
  var = _std(c, v, ddof) ** 2
  return (c * jax.lax.rsqrt(var + eps)).reshape(x.shape)


def _discounted_returns(
  token_rewards: jax.Array, mask: jax.Array, gamma: float
) -> jax.Array:
  """G_t = r_t + gamma G_{t+1} on mask = 1 tokens; carried through mask = 0."""

  def step(g_next, xs):
    r, m = xs
    g = jnp.where(m, r + gamma * g_next, g_next)
    return g, g

  _, g = jax.lax.scan(
    step,
    jnp.zeros(token_rewards.shape[0], jnp.float32),
    (token_rewards.T, mask.T > 0),
    reverse=True,
  )
  return g.T


def reinforce_plus_plus(
  rewards: jax.Array,
  mask: jax.Array,
  *,
  token_rewards: jax.Array | None = None,
  gamma: float = 1.0,
  ddof: int = 1,
  eps: float = 1e-8,
) -> jax.Array:
  """Discounted return of each token, whitened over the whole batch.

  REINFORCE++ (Hu et al. 2025, arXiv:2501.03262):
    G_t = sum_{s >= t} gamma^(s - t) r_s,   A = whiten(G) over batch tokens
  where r_s is the outcome reward on the last token plus `token_rewards`
  (e.g. -beta * KL_s, see kl.penalized_token_rewards). mask = 0 tokens
  (multi-turn observations) carry the return through unchanged, as verl.

  Args:
    rewards: [N] outcome reward per completion.
    mask: [N, T] completion-token mask.
    token_rewards: optional [N, T] per-token rewards added to the outcome.
    gamma: discount.
    ddof: delta degrees of freedom of the whitening variance.
    eps: added to that variance.

  Returns:
    [N, T] advantages, 0 where mask = 0.
  """
  r = outcome_token_rewards(rewards, mask)
  if token_rewards is not None:
    chex.assert_equal_shape([token_rewards, mask])
    r = r + token_rewards
  returns = _discounted_returns(r, mask, gamma)
  return whiten(returns, mask, ddof=ddof, eps=eps)


def reinforce_plus_plus_baseline(
  rewards: jax.Array,
  mask: jax.Array,
  group_size: int,
  *,
  token_rewards: jax.Array | None = None,
  gamma: float = 1.0,
  ddof: int = 1,
  eps: float = 1e-8,
  valid: jax.Array | None = None,
) -> jax.Array:
  """REINFORCE++ on group-mean-subtracted rewards.

  REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262):
    r'_i = r_i - mean_g(r),   then `reinforce_plus_plus` on r'

  Args:
    rewards: [N] outcome reward per completion, groups contiguous.
    mask: [N, T] completion-token mask.
    group_size: G.
    token_rewards: optional [N, T] per-token rewards (e.g. -beta * KL).
    gamma: discount.
    ddof: delta degrees of freedom of the whitening variance.
    eps: added to that variance.
    valid: optional [N] bool, as in `group_normalized`.

  Returns:
    [N, T] advantages, 0 where mask = 0.
  """
  centered = group_normalized(
    rewards, group_size, scale_by_std=False, valid=valid
  )
  return reinforce_plus_plus(
    centered,
    mask,
    token_rewards=token_rewards,
    gamma=gamma,
    ddof=ddof,
    eps=eps,
  )


def gae(
  token_rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
  whiten_advantages: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Generalized advantage estimation with a learned value function (PPO).

  GAE (Schulman et al. 2016, arXiv:1506.02438):
    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1}
    returns_t = A_t + V_t   (the value target, before whitening)
  mask = 0 tokens (multi-turn observations, padding) are skipped: the next
  value and the running advantage are carried through them unchanged, as
  verl. The value after the last completion token is 0.

  gamma = lam = 1 and whitening are verl's defaults; InstructGPT used
  lam = 0.95; VAPO decouples lam for the critic.

  Args:
    token_rewards: [N, T] per-token rewards (outcome_token_rewards plus any
      KL penalty).
    values: [N, T] value predictions V_t of the rollout-time critic.
    mask: [N, T] completion-token mask.
    gamma: discount.
    lam: GAE lambda.
    whiten_advantages: whiten A over the batch's valid tokens.

  Returns:
    (advantages [N, T], returns [N, T]), both 0 where mask = 0.
  """
  chex.assert_equal_shape([token_rewards, values, mask])
  m = mask > 0
  r = jnp.asarray(token_rewards, jnp.float32)
  v = jnp.asarray(values, jnp.float32)

  def step(carry, xs):
    next_value, next_adv = carry
    r_t, v_t, m_t = xs
    adv_t = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    next_value = jnp.where(m_t, v_t, next_value)
    next_adv = jnp.where(m_t, adv_t, next_adv)
    return (next_value, next_adv), next_adv

  zeros = jnp.zeros(r.shape[0], jnp.float32)
  _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, m.T), reverse=True)
  adv = jnp.where(m, adv.T, 0.0)
  returns = jnp.where(m, adv + v, 0.0)
  if whiten_advantages:
    adv = whiten(adv, mask)
  return adv, returns


def entropy_shaped(
  adv: jax.Array,
  entropy: jax.Array,
  *,
  alpha: float = 0.4,
  kappa: float = 2.0,
) -> jax.Array:
  """Adds a clipped, gradient-free entropy bonus to the advantage.

  Reasoning with Exploration: An Entropy Perspective (Cheng et al. 2025,
  arXiv:2506.14758):
    psi_t = min(alpha * sg(H_t), |A_t| / kappa),   A'_t = A_t + psi_t
  The clip keeps the bonus from flipping the sign of a negative advantage,
  and psi = 0 where A = 0 (all-equal groups stay untouched). Defaults
  alpha = 0.4, kappa = 2 are the paper's.

  Args:
    adv: [N] or [N, T] advantages.
    entropy: [N, T] per-token policy entropy H_t (losses.entropy_from_logits).
    alpha: entropy scale.
    kappa: the bonus is at most |A| / kappa.

  Returns:
    [N, T] shaped advantages.
  """
  chex.assert_rank(entropy, 2)
  if adv.ndim == 1:
    adv = jnp.broadcast_to(adv[:, None], entropy.shape)
  chex.assert_equal_shape([adv, entropy])
  psi = jnp.minimum(
    alpha * jax.lax.stop_gradient(entropy), jnp.abs(adv) / kappa
  )
  return adv + psi


_REGISTRY: dict[str, Callable[..., jax.Array]] = {
  "grpo": group_normalized,
  "dr_grpo": functools.partial(group_normalized, scale_by_std=False),
  "lite_ppo": batch_std_normalized,
  "rloo": leave_one_out,
  "opo": length_weighted,
  "gpg": gpg_scaled,
  "pass_at_k": pass_at_k,
  "max_minus_second": max_minus_second,
  "reinforce_plus_plus": reinforce_plus_plus,
  "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
  "gae": gae,
}


def names() -> tuple[str, ...]:
  """The names `get` accepts."""
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Callable[..., jax.Array]:
  """Returns the advantage estimator registered under `name`.

  Signatures: the group estimators take (rewards [N], group_size, ...)
  (`opo`: (rewards, lengths, group_size)); `reinforce_plus_plus` takes
  (rewards, mask), `reinforce_plus_plus_baseline` (rewards, mask,
  group_size); `gae` (token_rewards, values, mask) and returns
  (advantages, returns).

  Raises:
    ValueError: for an unknown name, listing the valid ones.
  """
  if name not in _REGISTRY:
    raise ValueError(
      f"Unknown advantage estimator {name!r}; valid names: {names()}."
    )
  return _REGISTRY[name]
