"""Token-level returns and advantages: REINFORCE++, GAE, entropy shaping.

Shapes: B prompts, G completions per prompt, N = B * G sequences, T
completion length. Outcome rewards arrive flat as `rewards` [N], each
prompt's G completions contiguous; per-token arrays are [N, T] with `mask`
[N, T] (1 = completion token; 0 = prompt padding, observation tokens of a
multi-turn episode, or padding after EOS). Every estimator here returns
[N, T], 0 where mask = 0, and is computed on WHOLE batches, before any
minibatch split (the whitening statistics are the batch's).

With r_t the token rewards (the outcome reward on the last completion
token, `outcome_token_rewards`, plus e.g. a -beta * KL_t penalty):
  G_t = r_t + gamma G_{t+1}                       discounted return
  A = whiten(G)                                   `reinforce_plus_plus`
  A = whiten(G) of r_i - mean_g(r)                `reinforce_plus_plus_baseline`
  delta_t = r_t + gamma V_{t+1} - V_t,
  A_t = delta_t + gamma lam A_{t+1}               `gae`
  A'_t = A_t + min(alpha sg(H_t), |A_t| / kappa)  `entropy_shaped`
with whiten(x) = (x - mean) / sqrt(var + eps) over the mask = 1 tokens.
mask = 0 tokens are skipped: the running return (GAE: the next value and
the running advantage) is carried through them unchanged, as verl.

Sequence-level (group) estimators live in advantages.py. `get(name)`
returns an estimator of this module by the name experiment flags use
(`--advantage`); `advantages.get` has the group ones.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from rlreason.rl import advantages


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
  flat = jnp.asarray(x, jnp.float32).reshape(1, -1)
  valid = v > 0
  n = v.sum(-1, keepdims=True)
  mean = (flat * v).sum(-1, keepdims=True) / jnp.where(n > 0, n, 1.0)
  # Exactly 0 for an all-equal input (as advantages' group centering): the
  # mean of equal floats can differ from them in the last bit.
  hi = jnp.where(valid, flat, -jnp.inf).max(-1, keepdims=True)
  lo = jnp.where(valid, flat, jnp.inf).min(-1, keepdims=True)
  c = jnp.where(valid & (hi > lo), flat - mean, 0.0)
  std = jnp.sqrt((c**2).sum(-1, keepdims=True) / jnp.maximum(n - ddof, 1.0))
  return (c * jax.lax.rsqrt(std**2 + eps)).reshape(x.shape)


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
    valid: optional [N] bool, as in `advantages.group_normalized`.

  Returns:
    [N, T] advantages, 0 where mask = 0.
  """
  centered = advantages.group_normalized(
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
    entropy: [N, T] per-token policy entropy H_t (policy.entropy_from_logits).
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
  "reinforce_plus_plus": reinforce_plus_plus,
  "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
  "gae": gae,
}


def names() -> tuple[str, ...]:
  """The names `get` accepts."""
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Callable[..., jax.Array]:
  """Returns the token-level estimator registered under `name`.

  Signatures: `reinforce_plus_plus` takes (rewards [N], mask [N, T]),
  `reinforce_plus_plus_baseline` (rewards, mask, group_size); `gae`
  (token_rewards, values, mask) and returns (advantages, returns).

  Raises:
    ValueError: for an unknown name, listing the valid ones (and where the
      group estimators are).
  """
  if name not in _REGISTRY:
    raise ValueError(
      f"Unknown token-level advantage estimator {name!r}; valid names: "
      f"{names()} (group estimators: advantages.get)."
    )
  return _REGISTRY[name]
