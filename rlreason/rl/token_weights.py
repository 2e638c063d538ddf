"""Per-token weights that multiply the policy loss.

Shapes: N sequences, T completion length; every input and output is [N, T],
with `mask` [N, T] (1 = completion token). A weight w multiplies the per-
token policy loss before aggregation (batch["weight"], or the token_weight
hook of objective.pg_loss), l'_t = w_t * l_t, and is stop-gradient:
  top_entropy_mask     w_t = [H_t among the top ceil(rho * n) of the batch]
                       (forking tokens, arXiv:2506.01939)
  truncated_is_weight  w_t = min(pi_old(y_t) / pi_sampler(y_t), C)  (TIS)
Keep `mask` (and its normaliser) in aggregation.aggregate: the weights do
not change the denominator.
"""

import chex
import jax
import jax.numpy as jnp

sg = jax.lax.stop_gradient


def top_entropy_mask(
  entropy: jax.Array, mask: jax.Array, *, top_frac: float = 0.2
) -> jax.Array:
  """Keeps the highest-entropy ("forking") tokens of the batch.

  Beyond the 80/20 Rule (Wang et al. 2025, arXiv:2506.01939): the policy
  gradient is applied only to the top-rho entropy tokens of the batch
  (rho = 0.2), ceil(top_frac * num_valid) tokens here. Multiply the per-token
  loss by the result and keep `mask` (and its normaliser) in
  aggregation.aggregate: the paper still divides by all the batch's tokens.

  Args:
    entropy: [N, T] per-token entropy (policy.entropy_from_logits).
    mask: [N, T] completion-token mask.
    top_frac: fraction of valid tokens to keep.

  Returns:
    [N, T] float mask, 1 on the kept tokens.
  """
  chex.assert_equal_shape([entropy, mask])
  m = mask > 0
  # top_frac * n in float32 can land a hair above an integer (0.2 * 5).
  k = jnp.ceil(top_frac * m.sum() - 1e-4)
  key = jnp.where(m, sg(entropy), -jnp.inf).reshape(-1)
  order = jnp.argsort(-key, stable=True)  # ties: the earlier token first
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(key.size))
  return (m & (rank.reshape(mask.shape) < k)).astype(jnp.float32)


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
  chex.assert_equal_shape([old_logp, sampler_logp, mask])
  log_w = jnp.where(mask > 0, jnp.subtract(old_logp, sampler_logp), 0.0)
  if level == "sequence":
    log_w = jnp.broadcast_to(log_w.sum(-1, keepdims=True), mask.shape)
  elif level != "token":
    raise ValueError(f"Unknown level {level!r}; valid: ('token', 'sequence').")
  w = jnp.exp(jnp.minimum(log_w, jnp.log(cap)))
  return sg(jnp.where(mask > 0, w, 0.0))
