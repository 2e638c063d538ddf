"""Per-token weights that multiply the policy loss.

Shapes: N sequences, T completion length; every input and output is [N, T],
with `mask` [N, T] (1 = completion token). A weight w multiplies the per-
token policy loss before aggregation (batch["weight"], or the token_weight
hook of objective.pg_loss), l'_t = w_t * l_t, and is stop-gradient:
  top_entropy_mask     w_t = [H_t among the top ceil(rho * n) of the batch]
                       (forking tokens, arXiv:2506.01939)
  truncated_is_weight  w_t = min(pi_old(y_t) / pi_sampler(y_t), C)  (TIS)
  masked_is_weight     w_t = r_t if 1/C <= r_t <= C else 0            (MIS)
and mismatch_metrics reports how far the sampler and the trainer disagree.
Keep `mask` in aggregation.aggregate; the weights do not change its
denominator, except where a method says so (forking tokens divide by the
kept tokens: `top_entropy_count`).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

sg = jax.lax.stop_gradient


def top_entropy_mask(
  entropy: jax.Array, mask: jax.Array, *, top_frac: float = 0.2
) -> jax.Array:
  """Keeps the highest-entropy ("forking") tokens of the batch.

  Beyond the 80/20 Rule (Wang et al. 2025, arXiv:2506.01939): the policy
  gradient is applied only to the top-rho entropy tokens of the batch
  (rho = 0.2), `top_entropy_count(num_valid)` = ceil(rho * num_valid)
  tokens here. Multiply the per-token loss by the result; the paper's
  Eq. (6) and the authors' code (verl agg_loss over response_mask *
  entropy_top_mask) divide by the kept tokens, so pass that count as
  aggregation.aggregate's num_tokens.

  Args:
    entropy: [N, T] per-token entropy (policy.entropy_from_logits).
    mask: [N, T] completion-token mask.
    top_frac: fraction of valid tokens to keep.

  Returns:
    [N, T] float mask, 1 on the kept tokens.
  """
  chex.assert_equal_shape([entropy, mask])
  m = mask > 0
  k = top_entropy_count(m.sum(), top_frac)
  key = jnp.where(m, sg(entropy), -jnp.inf).reshape(-1)
  order = jnp.argsort(-key, stable=True)  # ties: the earlier token first
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(key.size))
  return (m & (rank.reshape(mask.shape) < k)).astype(jnp.float32)


def top_entropy_count(num_valid, top_frac: float = 0.2):
  """ceil(top_frac * num_valid): how many tokens `top_entropy_mask` keeps
  of num_valid (a count or an array of counts)."""
  # top_frac * n in float32 can land a hair above an integer (0.2 * 5).
  return jnp.ceil(top_frac * jnp.asarray(num_valid, jnp.float32) - 1e-4)


def truncated_is_weight(
  old_logp: jax.Array,
  sampler_logp: jax.Array,
  mask: jax.Array,
  *,
  cap: float = 2.0,
  level: str = "token",
) -> jax.Array:
  """Truncated importance weight between the trainer and the sampler.

  TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl):
  the sampler (e.g. a fast inference engine) and the trainer compute
  slightly different probabilities; the loss is reweighted by
    w_t = min(pi_old(y_t) / pi_sampler(y_t), C)          (level="token")
    w_i = min(prod_t pi_old / pi_sampler, C)             (level="sequence")
  C = 2 as in the post and oat. Multiply the per-token loss by w.

  Args:
    old_logp: [N, T] trainer log-probs of the rollout policy.
    sampler_logp: [N, T] log-probs recorded by the sampler.
    mask: [N, T] completion-token mask.
    cap: C.
    level: "token" or "sequence".

  Returns:
    [N, T] stop-gradient weights, 0 where mask = 0.
  """
  log_w = _log_ratio(old_logp, sampler_logp, mask, level)
  w = jnp.exp(jnp.minimum(log_w, jnp.log(cap)))
  return sg(jnp.where(mask > 0, w, 0.0))


def _log_ratio(old_logp, sampler_logp, mask, level):
  """log pi_old / pi_sampler per token, or summed per sequence and
  broadcast over its tokens; 0 where mask = 0."""
  chex.assert_equal_shape([old_logp, sampler_logp, mask])
  log_r = jnp.where(mask > 0, jnp.subtract(old_logp, sampler_logp), 0.0)
  if level == "sequence":
    return jnp.broadcast_to(log_r.sum(-1, keepdims=True), mask.shape)
  if level != "token":
    raise ValueError(f"Unknown level {level!r}; valid: ('token', 'sequence').")
  return log_r


def masked_is_weight(
  old_logp: jax.Array,
  sampler_logp: jax.Array,
  mask: jax.Array,
  *,
  cap: float = 2.0,
  level: str = "token",
) -> jax.Array:
  """Masked importance weight between the trainer and the sampler (MIS).

  Tokens (level="token") or whole sequences (level="sequence", the ratio
  being the product over the sequence) whose ratio r = pi_old / pi_sampler
  falls outside [1/C, C] are dropped (weight 0); the others keep r:
    w_t = r_t if 1/C <= r_t <= C else 0
  (ms-swift's token_mask / sequence_mask, verl's rollout rejection with
  IS weights). Multiply the per-token loss by w.

  Returns:
    [N, T] stop-gradient weights, 0 where mask = 0.
  """
  log_r = _log_ratio(old_logp, sampler_logp, mask, level)
  bound = jnp.log(cap)
  keep = (log_r >= -bound) & (log_r <= bound) & (mask > 0)
  return sg(jnp.where(keep, jnp.exp(log_r), 0.0))


def mismatch_metrics(old_logp, sampler_logp, mask, weight=None) -> dict:
  """How far the sampler's log-probs are from the trainer's, over the
  completion tokens (host numpy):
    abs_log_ratio  mean |log pi_old - log pi_sampler|
    k3_kl          mean (r - 1 - log r), r = pi_old / pi_sampler: a
                   non-negative estimate of KL(pi_sampler || pi_old)
    max_abs_log_ratio
  and, given the correction's weights, the fraction of tokens they zero
  (dropped) and the mean weight."""
  m = np.asarray(mask) > 0
  n = max(int(m.sum()), 1)
  log_r = np.where(m, np.asarray(old_logp) - np.asarray(sampler_logp), 0.0)
  out = {
    "abs_log_ratio": float(np.abs(log_r).sum() / n),
    "k3_kl": float(np.where(m, np.expm1(log_r) - log_r, 0.0).sum() / n),
    "max_abs_log_ratio": float(np.abs(log_r).max(initial=0.0)),
  }
  if weight is not None:
    w = np.asarray(weight)
    out["dropped"] = float(((w == 0) & m).sum() / n)
    out["mean_weight"] = float(np.where(m, w, 0.0).sum() / n)
  return out
