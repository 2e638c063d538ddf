"""KL-divergence estimators from sampled-token log-probs, and their placement.

Shapes: N sequences, T completion length. `logp` and `ref_logp` are [N, T]
log-probs of the sampled tokens under the trained and the reference policy;
with delta = logp - ref_logp and tokens sampled from the trained policy
(Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html):
  k1 = delta                        unbiased, can be negative
  k2 = delta^2 / 2                  biased, low variance
  k3 = exp(-delta) + delta - 1      unbiased, >= 0
  k3+ = value of k3, gradient of k2 (straight-through), verl's "k3+"
The estimators return per-token [N, T] values; mask and aggregate them with
aggregation.aggregate (KL in the loss), or fold them into the reward with
`penalized_token_rewards` (KL in the reward, optionally with an adaptive
coefficient, `adaptive_kl_coef`).

Clamps differ between frameworks and are off by default (the papers have
none): verl clamps delta to +-20 inside k3 and k3's value to +-10; OpenRLHF
clamps every estimator's value to +-10; oat clamps delta to +-40.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from rlreason.rl import returns as returns_lib


def _log_ratio(
  logp: jax.Array, ref_logp: jax.Array, log_ratio_clip: float | None
) -> jax.Array:
  chex.assert_equal_shape([logp, ref_logp])
  delta = jnp.subtract(logp, ref_logp)
  if log_ratio_clip is not None:
    delta = jnp.clip(delta, -log_ratio_clip, log_ratio_clip)
  return delta


def _clip_value(x: jax.Array, value_clip: float | None) -> jax.Array:
  return x if value_clip is None else jnp.clip(x, -value_clip, value_clip)


def kl_k1(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  log_ratio_clip: float | None = None,
  value_clip: float | None = None,
) -> jax.Array:
  """k1 = logp - ref_logp ([N, T] -> [N, T]); the estimator used in rewards."""
  return _clip_value(_log_ratio(logp, ref_logp, log_ratio_clip), value_clip)


def kl_abs(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  log_ratio_clip: float | None = None,
  value_clip: float | None = None,
) -> jax.Array:
  """|logp - ref_logp| ([N, T] -> [N, T]); verl's "abs"."""
  delta = _log_ratio(logp, ref_logp, log_ratio_clip)
  return _clip_value(jnp.abs(delta), value_clip)


def kl_k2(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  log_ratio_clip: float | None = None,
  value_clip: float | None = None,
) -> jax.Array:
  """k2 = (logp - ref_logp)^2 / 2 ([N, T] -> [N, T]); verl's "mse"."""
  delta = _log_ratio(logp, ref_logp, log_ratio_clip)
  return _clip_value(0.5 * delta**2, value_clip)


def kl_k3(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  log_ratio_clip: float | None = None,
  value_clip: float | None = None,
) -> jax.Array:
  """k3 = exp(-delta) + delta - 1, delta = logp - ref_logp ([N, T] -> [N, T]).

  GRPO's KL term (Shao et al. 2024, arXiv:2402.03300), written with
  expm1 for accuracy near delta = 0. verl: log_ratio_clip=20, value_clip=10.
  """
  delta = _log_ratio(logp, ref_logp, log_ratio_clip)
  return _clip_value(jnp.expm1(-delta) + delta, value_clip)


def kl_k3_plus(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  log_ratio_clip: float | None = None,
  value_clip: float | None = None,
) -> jax.Array:
  """Value of k3, gradient of k2 (straight-through), ([N, T] -> [N, T]).

    k3+ = sg(k3) + k2 - sg(k2)
  verl's "k3+": k3 in the loss has a biased gradient (TRL issue #4967);
  k2's gradient delta * grad(logp) is the gradient of the true reverse KL
  in expectation. The clamps apply to the value only.
  """
  k2 = kl_k2(logp, ref_logp)
  k3 = kl_k3(
    logp, ref_logp, log_ratio_clip=log_ratio_clip, value_clip=value_clip
  )
  return jax.lax.stop_gradient(k3) + k2 - jax.lax.stop_gradient(k2)


_REGISTRY: dict[str, Callable[..., jax.Array]] = {
  "k1": kl_k1,
  "abs": kl_abs,
  "k2": kl_k2,
  "k3": kl_k3,
  "k3+": kl_k3_plus,
}


def names() -> tuple[str, ...]:
  """The names `get` accepts."""
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Callable[..., jax.Array]:
  """Returns the estimator `fn(logp, ref_logp, **clamps) -> [N, T]` by name.

  Raises:
    ValueError: for an unknown name, listing the valid ones.
  """
  if name not in _REGISTRY:
    raise ValueError(f"Unknown KL estimator {name!r}; valid names: {names()}.")
  return _REGISTRY[name]


def penalized_token_rewards(
  rewards: jax.Array, kl: jax.Array, mask: jax.Array, *, coef: float
) -> jax.Array:
  """Outcome reward on the last token minus a per-token KL penalty.

  InstructGPT / REINFORCE++ style (Ouyang et al. 2022, arXiv:2203.02155;
  arXiv:2501.03262): r_t = r * [t = last] - coef * KL_t. verl and OpenRLHF
  compute KL_t with the rollout-time (old) policy's log-probs, k1 usually.

  Args:
    rewards: [N] outcome reward per completion.
    kl: [N, T] per-token KL estimate (already stop-gradient'ed by the caller
      or computed from rollout-time log-probs).
    mask: [N, T] completion-token mask.
    coef: KL coefficient beta (e.g. `KLCoef.coef`).

  Returns:
    [N, T] token rewards for returns.gae / reinforce_plus_plus, 0 where
    mask = 0.
  """
  chex.assert_equal_shape([kl, mask])
  penalty = jnp.where(mask > 0, coef * kl, 0.0)
  return returns_lib.outcome_token_rewards(rewards, mask) - penalty


class KLCoef(NamedTuple):
  """State of the KL-coefficient controller: the current coefficient."""

  coef: jax.Array


def adaptive_kl_coef(
  state: KLCoef,
  observed_kl: jax.Array,
  n_steps: int | jax.Array,
  *,
  target_kl: float | None,
  horizon: float = 10_000.0,
  max_error: float = 0.2,
) -> KLCoef:
  """Proportional controller moving the KL coefficient toward a target KL.

  Ziegler et al. 2019 (arXiv:1909.08593):
    e = clip(KL / target - 1, -0.2, 0.2),   beta <- beta (1 + e n_steps / H)
  target_kl=None is the fixed controller (returns the state unchanged).

  Args:
    state: the current coefficient.
    observed_kl: scalar mean KL of the last batch.
    n_steps: samples (verl: batch size) since the last update.
    target_kl: the KL to track, or None for a fixed coefficient.
    horizon: H.
    max_error: clip of the proportional error.

  Returns:
    The updated state.
  """
  if target_kl is None:
    return state
  error = jnp.clip(observed_kl / target_kl - 1.0, -max_error, max_error)
  return KLCoef(state.coef * (1.0 + error * n_steps / horizon))
