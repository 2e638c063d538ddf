"""Policy losses of the PPO family, and the entropy bonus.

Shapes: N sequences, T completion length, V vocab. Per-token inputs are
[N, T]: `logp` (trained policy), `old_logp` (policy that the PPO ratio is
taken against), `mask` (1 = completion token). `adv` is [N] (one advantage
per sequence, broadcast over its tokens) or [N, T].

Every policy loss has the signature
    fn(logp, old_logp, adv, mask, **kw) -> (per_token_loss, metrics)
with per_token_loss [N, T] (0 where mask = 0) and metrics a dict of [N, T]
per-token values (clip indicators, ratio, approx. KL; average them with
"token-mean"). Reducing to a scalar is a separate step, aggregation.py.
`get_policy_loss(name)` returns a loss by the name experiment flags use;
experiment files bind the keyword arguments with functools.partial.

KL estimators live in kl.py, per-token weights that multiply the loss
(forking tokens, TIS) in token_weights.py, the critic's value loss in
value.py. Log-probs at mask = 0 positions may be garbage (even -inf): the
losses never let them reach a value or a gradient.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]
PolicyLoss = Callable[..., tuple[jax.Array, Metrics]]
sg = jax.lax.stop_gradient


def _per_token(adv: jax.Array, mask: jax.Array) -> jax.Array:
  """[N] or [N, T] advantages -> [N, T]."""
  if adv.ndim == 1:
    adv = jnp.broadcast_to(adv[:, None], mask.shape)
  chex.assert_equal_shape([adv, mask])
  return adv


def _log_ratio(logp, old_logp, mask):
  """log(pi / pi_old) on valid tokens, 0 elsewhere ([N, T])."""
  chex.assert_equal_shape([logp, old_logp, mask])
  return jnp.where(mask > 0, jnp.subtract(logp, old_logp), 0.0)


def _rank_desc(x: jax.Array) -> jax.Array:
  """0-based rank of each element of x in descending order (ties by index)."""
  flat = x.reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  return (
    jnp.zeros_like(order).at[order].set(jnp.arange(flat.size)).reshape(x.shape)
  )


# ----------------------------------------------------------------------------
# Policy losses.


def clipped_surrogate(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  clip_eps_low: float = 0.2,
  clip_eps_high: float = 0.2,
  dual_clip: float | None = None,
  log_ratio_clip: float | None = None,
  ratio_cap: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO's clipped surrogate, with clip-higher and dual-clip.

  PPO (Schulman et al. 2017, arXiv:1707.06347), as a loss to minimise:
    rho = exp(logp - old_logp)
    l = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
  Clip-higher (DAPO, arXiv:2503.14476): eps_high > eps_low (0.28 vs 0.2).
  Dual-clip (Ye et al. 2020, arXiv:1912.09729), dual_clip = c > 1:
    l = min(l, -c A) where A < 0
  verl always applies c = 3 and clamps logp - old_logp to +-20
  (log_ratio_clip=20); OpenRLHF dual-clips only on request; TRL does neither
  and can cap the unclipped ratio, rho <- min(rho, delta) (ratio_cap).
  Defaults follow the PPO paper: none of these.

  Args:
    logp: [N, T] log-probs of the sampled tokens under the trained policy.
    old_logp: [N, T] the same under the policy that sampled them.
    adv: [N] or [N, T] advantages.
    mask: [N, T] completion-token mask.
    clip_eps_low: lower clip range.
    clip_eps_high: upper clip range.
    dual_clip: c of dual-clip PPO, or None.
    log_ratio_clip: clamp of logp - old_logp before exp, or None.
    ratio_cap: TRL's delta, a cap on the unclipped ratio, or None.

  Returns:
    (per-token loss [N, T], metrics): "ratio", "clipfrac" (the clipped term
    is the active one), "clipfrac_lower" (dual clip active), "approx_kl"
    (old_logp - logp, verl's ppo_kl), all [N, T].
  """
  adv = _per_token(adv, mask)
  log_ratio = _log_ratio(logp, old_logp, mask)
  if log_ratio_clip is not None:
    log_ratio = jnp.clip(log_ratio, -log_ratio_clip, log_ratio_clip)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio if ratio_cap is None else jnp.minimum(ratio, ratio_cap)
  loss1 = -adv * unclipped
  loss2 = -adv * jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
  loss = jnp.maximum(loss1, loss2)
  clipped_lower = jnp.zeros_like(loss, dtype=bool)
  if dual_clip is not None:
    if dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1, got {dual_clip}.")
    loss3 = -adv * dual_clip
    clipped_lower = (adv < 0) & (loss > loss3)
    loss = jnp.where(adv < 0, jnp.minimum(loss, loss3), loss)
  metrics = {
    "ratio": sg(ratio),
    "clipfrac": (loss2 > loss1).astype(jnp.float32),
    "clipfrac_lower": clipped_lower.astype(jnp.float32),
    "approx_kl": sg(-log_ratio),
  }
  return jnp.where(mask > 0, loss, 0.0), metrics


def gspo(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  clip_eps_low: float = 3e-4,
  clip_eps_high: float = 4e-4,
  max_log_ratio: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO clipping on the length-normalised sequence ratio (GSPO-token).

  GSPO (Zheng et al. 2025, arXiv:2507.18071):
    log s_i = 1/|o_i| sum_t (logp_it - old_logp_it)
    log s_it = sg(log s_i) + logp_it - sg(logp_it)
    l_it = max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))
  The forward value of s_it is s_i; the gradient is s_i * grad(logp_it).
  With the paper's seq-mean-token-mean aggregation this is GSPO (and
  GSPO-token with per-token advantages). eps defaults are the paper's.
  verl clamps log s_it at 10 (max_log_ratio=10).

  Args:
    logp, old_logp, adv, mask: as in `clipped_surrogate`.
    clip_eps_low: lower clip range of s.
    clip_eps_high: upper clip range of s.
    max_log_ratio: upper clamp of log s_it, or None.

  Returns:
    (per-token loss [N, T], metrics "ratio" (s_i), "clipfrac", "approx_kl").
  """
  adv = _per_token(adv, mask)
  log_ratio = _log_ratio(logp, old_logp, mask)
  length = jnp.maximum((mask > 0).sum(-1, keepdims=True), 1)
  seq_log_ratio = log_ratio.sum(-1, keepdims=True) / length  # [N, 1]
  logp = jnp.where(mask > 0, logp, 0.0)
  log_s = sg(seq_log_ratio) + logp - sg(logp)  # [N, T]
  if max_log_ratio is not None:
    log_s = jnp.minimum(log_s, max_log_ratio)
  s = jnp.exp(log_s)
  loss1 = -adv * s
  loss2 = -adv * jnp.clip(s, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
  metrics = {
    "ratio": sg(s),
    "clipfrac": (loss2 > loss1).astype(jnp.float32),
    "approx_kl": sg(-log_ratio),
  }
  return jnp.where(mask > 0, jnp.maximum(loss1, loss2), 0.0), metrics


def cispo(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  clip_eps_low: float | None = None,
  clip_eps_high: float = 4.0,
) -> tuple[jax.Array, Metrics]:
  """REINFORCE weighted by a clipped, stop-gradient importance weight.

  CISPO (MiniMax-M1, arXiv:2506.13585):
    l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A logp
  Unlike PPO no token loses its gradient; only the weight is bounded. The
  paper sets no lower bound (clip_eps_low=None). TRL caps rho at
  epsilon_high = 5 (absolute), the same as clip_eps_high = 4 here.

  Args:
    logp, old_logp, adv, mask: as in `clipped_surrogate`.
    clip_eps_low: lower clip range of the weight, or None (no lower bound).
    clip_eps_high: upper clip range of the weight.

  Returns:
    (per-token loss [N, T], metrics "ratio", "clipfrac", "approx_kl").
  """
  adv = _per_token(adv, mask)
  log_ratio = _log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_ratio)
  low = None if clip_eps_low is None else 1.0 - clip_eps_low
  weight = sg(jnp.clip(ratio, low, 1.0 + clip_eps_high))
  loss = -weight * adv * jnp.where(mask > 0, logp, 0.0)
  metrics = {
    "ratio": sg(ratio),
    "clipfrac": (weight != sg(ratio)).astype(jnp.float32),
    "approx_kl": sg(-log_ratio),
  }
  return jnp.where(mask > 0, loss, 0.0), metrics


def policy_gradient(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
) -> tuple[jax.Array, Metrics]:
  """Plain policy gradient, l = -A logp (REINFORCE; GPG, arXiv:2504.02546).

  old_logp is only used for the "approx_kl" metric (the signature is the
  registry's). Use it on-policy (one update per batch), as GPG does.

  Returns:
    (per-token loss [N, T], metrics "approx_kl").
  """
  adv = _per_token(adv, mask)
  log_ratio = _log_ratio(logp, old_logp, mask)
  loss = -adv * jnp.where(mask > 0, logp, 0.0)
  return jnp.where(mask > 0, loss, 0.0), {"approx_kl": sg(-log_ratio)}


def _fraction_of_valid(
  frac: float, mask: jax.Array, *, round_up: bool
) -> jax.Array:
  """floor (or ceil) of frac * the number of valid tokens, as a float.

  frac * n in float32 can land a hair off an exact integer (0.2 * 5);
  the 1e-4 slack keeps floor / ceil from rounding it the wrong way.
  """
  x = frac * (mask > 0).sum()
  return jnp.ceil(x - 1e-4) if round_up else jnp.floor(x + 1e-4)


def _token_cov(logp: jax.Array, adv: jax.Array, mask: jax.Array) -> jax.Array:
  """(A - mean A)(logp - mean logp) per token, means over the valid tokens."""
  m = mask > 0
  n = jnp.maximum(m.sum(), 1)
  logp = jnp.where(m, sg(logp), 0.0)
  adv = jnp.where(m, sg(adv), 0.0)
  cov = (adv - adv.sum() / n) * (logp - logp.sum() / n)
  return jnp.where(m, cov, -jnp.inf)


def clip_cov(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  rng: jax.Array,
  clip_eps_low: float = 0.2,
  clip_eps_high: float = 0.2,
  clip_ratio: float = 2e-4,
  cov_lb: float = 1.0,
  cov_ub: float = 5.0,
) -> tuple[jax.Array, Metrics]:
  """PPO surrogate with the gradient of a few high-covariance tokens removed.

  Clip-Cov (Cui et al. 2025, arXiv:2505.22617): entropy falls at a rate set
  by Cov(logp, A). Per token, cov_t = (A_t - mean A)(logp_t - mean logp)
  (means over the batch's valid tokens). Among the valid tokens that PPO did
  not already clip and with cov_lb < cov_t < cov_ub, a random subset of
  max(floor(clip_ratio * num_valid), 1) tokens is detached. Defaults are the
  paper's. Deviation: verl multiplies the selected tokens' loss by 0; here
  the value is kept (sg) so the reported loss is PPO's; gradients agree.
  The statistics are over the batch passed in (as verl: the micro-batch).

  Args:
    logp, old_logp, adv, mask: as in `clipped_surrogate`.
    rng: PRNG key for the random subset.
    clip_eps_low, clip_eps_high: PPO clip ranges.
    clip_ratio: fraction of valid tokens to detach.
    cov_lb, cov_ub: covariance window of the candidates.

  Returns:
    (per-token loss [N, T], metrics of `clipped_surrogate` plus
    "cov_clipped", the detached-token indicator).
  """
  loss, metrics = clipped_surrogate(
    logp,
    old_logp,
    adv,
    mask,
    clip_eps_low=clip_eps_low,
    clip_eps_high=clip_eps_high,
  )
  cov = _token_cov(logp, _per_token(adv, mask), mask)
  candidate = (metrics["clipfrac"] == 0) & (cov > cov_lb) & (cov < cov_ub)
  k = jnp.maximum(_fraction_of_valid(clip_ratio, mask, round_up=False), 1)
  priority = jnp.where(candidate, jax.random.uniform(rng, mask.shape), -1.0)
  selected = candidate & (_rank_desc(priority) < k)
  metrics["cov_clipped"] = selected.astype(jnp.float32)
  return jnp.where(selected, sg(loss), loss), metrics


def kl_cov(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  kl_cov_ratio: float = 2e-4,
  kl_coef: float = 1.0,
) -> tuple[jax.Array, Metrics]:
  """Unclipped surrogate plus a KL penalty on the top-covariance tokens.

  KL-Cov (Cui et al. 2025, arXiv:2505.22617):
    l_t = -A_t rho_t + [t in top-k cov] * kl_coef * |logp_t - old_logp_t|
  with k = max(floor(kl_cov_ratio * num_valid), 1), cov as in `clip_cov`.
  There is no ratio clipping. kl_coef = 1 as in the authors' scripts (verl's
  config default is 0.1). Statistics are over the batch passed in.

  Args:
    logp, old_logp, adv, mask: as in `clipped_surrogate`.
    kl_cov_ratio: fraction of valid tokens to penalise.
    kl_coef: penalty coefficient.

  Returns:
    (per-token loss [N, T], metrics "ratio", "approx_kl", "kl_penalized").
  """
  adv = _per_token(adv, mask)
  log_ratio = _log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_ratio)
  cov = _token_cov(logp, adv, mask)
  k = jnp.maximum(_fraction_of_valid(kl_cov_ratio, mask, round_up=False), 1)
  selected = (mask > 0) & (_rank_desc(cov) < k)
  # |x| as x * sg(sign(x)): subgradient 0 at x = 0, as torch (jnp.abs: 1).
  abs_log_ratio = log_ratio * sg(jnp.sign(log_ratio))
  loss = -adv * ratio + jnp.where(selected, kl_coef * abs_log_ratio, 0.0)
  metrics = {
    "ratio": sg(ratio),
    "approx_kl": sg(-log_ratio),
    "kl_penalized": selected.astype(jnp.float32),
  }
  return jnp.where(mask > 0, loss, 0.0), metrics


_POLICY_LOSSES: dict[str, PolicyLoss] = {
  "ppo": clipped_surrogate,
  "gspo": gspo,
  "cispo": cispo,
  "gpg": policy_gradient,
  "reinforce": policy_gradient,
  "clip_cov": clip_cov,
  "kl_cov": kl_cov,
}


def policy_loss_names() -> tuple[str, ...]:
  """The names `get_policy_loss` accepts."""
  return tuple(sorted(_POLICY_LOSSES))


def get_policy_loss(name: str) -> PolicyLoss:
  """Returns `fn(logp, old_logp, adv, mask, **kw) -> (loss, metrics)`.

  "clip_cov" needs rng=...; the others take only their hyperparameters.

  Raises:
    ValueError: for an unknown name, listing the valid ones.
  """
  if name not in _POLICY_LOSSES:
    raise ValueError(
      f"Unknown policy loss {name!r}; valid names: {policy_loss_names()}."
    )
  return _POLICY_LOSSES[name]


# ----------------------------------------------------------------------------
# Entropy.


def entropy_bonus(
  entropy: jax.Array, mask: jax.Array, *, coef: float
) -> jax.Array:
  """Per-token loss -coef * H ([N, T]), to be aggregated and added.

  Maximum-entropy regularisation as in verl / OpenRLHF
  (loss -= coef * agg(H)); TRL always uses token-mean for this term.
  """
  chex.assert_equal_shape([entropy, mask])
  return jnp.where(mask > 0, -coef * entropy, 0.0)
