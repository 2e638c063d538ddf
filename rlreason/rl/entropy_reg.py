"""Selective entropy regularisers that need the whole next-token distribution.

Shapes: N sequences, T completion length, V vocab. `logits` are the scored
logits (logits / temperature), [..., V]: the functions of them are
policy.completion_logprobs' `per_token` functions, computed in chunks of
tokens (no [N, T, V] is ever whole); per-token arrays are [N, T] with `mask`
[N, T].

SIREN (2025, "Rethinking Entropy Regularization in Large
Reasoning Models", arXiv:2509.25133; authors' code Linn3a/siren):
  H^p_t      entropy of the top-p head of pi(. | s_t), renormalised
             (`nucleus_entropy`), so the bonus cannot spread mass over the
             long tail of the vocabulary;
  m_t        only each sequence's peak-entropy tokens, H^p_t above the
             sequence's 80th percentile (`peak_entropy_mask`);
  L_reg      coef * (Hbar - H_anchor)^2, Hbar the masked H^p averaged
             seq-mean-token-mean, H_anchor its value under the initial
             policy (`anchored_entropy_penalty`): the entropy is held near
             where it started instead of pushed up without bound.

Lp-Reg (2025, "Low-probability Tokens Sustain Exploration in
Reinforcement Learning with Verifiable Reward", arXiv:2510.03222; authors'
code CarlanLark/Lp-Reg-dev):
  pi_proxy   the rollout policy with its presumed-noise tokens removed
             (min-p: p_v < kappa * max_v p_v) and renormalised
             (`minp_proxy_logprobs`): surviving low-probability tokens
             ("reasoning sparks") get more mass than under pi;
  L          PPO, except on the lowest-probability tokens of the negative-
             advantage samples that the proxy keeps, where the loss is
             -A rho + coef * k3(pi_theta, pi_proxy) (`lp_reg`): those
             tokens are shielded from being pushed to zero.
"""

import functools

import chex
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses
from rlreason.model import policy
from rlreason.sampling import vocab_scan

sg = jax.lax.stop_gradient


# ----------------------------------------------------------------------------
# SIREN.


def nucleus_entropy(logits: jax.Array, top_p: float = 0.8) -> jax.Array:
  """Entropy of the renormalised top-p head of softmax(logits), in nats.

  With probabilities sorted in decreasing order p_(1) >= p_(2) >= ..., the
  head is {(i) : p_(1) + ... + p_(i) < top_p} (the token that crosses top_p
  is excluded, as the authors' `efficient_top_p_sampling`; a token with
  p >= top_p leaves the head empty and H = 0), and
    q = p / sum_head p,   H^p = -sum_head q log q.
  The head is chosen without gradient; the gradient flows through q.
  top_p >= 1: the whole vocabulary (the plain entropy).

  No sort: the crossing token's logit t is the nucleus threshold (the
  largest t with mass(z >= t) >= top_p, vocab_scan.nucleus_threshold: a
  bisection of masked sums over V, which stays split when V is split over
  devices), and the head is z > t. Tokens tied with the crossing token are
  all out of the head (a sort keeps those ranked before it).

  Args:
    logits: [..., V] scored logits.
    top_p: nucleus mass (SIREN's entropy_topp = 0.8).

  Returns:
    [...] entropy of the head (0 where the head is empty).
  """
  z = logits.astype(jnp.float32)
  if top_p >= 1:
    head = jnp.ones(z.shape, bool)
  else:
    t = vocab_scan.nucleus_threshold(sg(z).reshape(-1, z.shape[-1]), top_p)
    # Kept by policy's chunked remat: the bisection is 32 passes over V.
    t = checkpoint_name(t.reshape(z.shape[:-1] + (1,)), policy.SAVED)
    head = z > t
  # Normalising an empty head over the top token keeps log Z finite (and
  # its gradient free of NaN), and H = 0 there anyway.
  empty = ~jnp.any(head, axis=-1, keepdims=True)
  top = sg(z) >= jnp.max(sg(z), axis=-1, keepdims=True)
  norm = head | (empty & top)
  log_z = jax.nn.logsumexp(jnp.where(norm, z, -jnp.inf), axis=-1)
  logq = jnp.where(head, z - log_z[..., None], 0.0)
  return -jnp.sum(jnp.where(head, jnp.exp(logq) * logq, 0.0), axis=-1)


def peak_entropy_mask(
  entropy: jax.Array, mask: jax.Array, *, quantile: float = 0.8
) -> jax.Array:
  """Each sequence's tokens whose entropy is above its `quantile`.

  SIREN's peak-entropy mask (authors' `mask_by_quantile`): per sequence,
  q_i = quantile of {H_it : mask_it = 1} (linear interpolation, as
  torch.nanquantile), and a token is kept iff H_it > q_i. Deviation: the
  authors do not AND the result with the completion mask; here padding is
  never kept.

  Args:
    entropy: [N, T] per-token entropy.
    mask: [N, T] completion-token mask.
    quantile: SIREN's mask_ratio (0.8: the top 20% of each sequence).

  Returns:
    [N, T] float mask (stop-gradient), 0 for empty sequences.
  """
  chex.assert_equal_shape([entropy, mask])
  m = mask > 0
  h = jnp.where(m, sg(entropy), jnp.nan)
  # nanquantile of an all-NaN row is NaN; the comparison is then False.
  q = jnp.nanquantile(h, quantile, axis=-1, keepdims=True)
  return (m & (h > q)).astype(jnp.float32)


def anchored_entropy_penalty(
  entropy: jax.Array,
  token_mask: jax.Array,
  anchor: jax.Array | float,
  *,
  coef: float,
) -> tuple[jax.Array, jax.Array]:
  """SIREN's self-anchored regulariser coef * (Hbar - anchor)^2.

  Hbar is the seq-mean-token-mean of `entropy` over `token_mask` (the
  authors' entropy_agg_mode), over the batch passed in (as the authors: the
  micro-batch). The square is not split-invariant: with micro-batches each
  gets its own Hbar.

  Args:
    entropy: [N, T] (nucleus) entropy, with gradient.
    token_mask: [N, T] tokens that count (peak_entropy_mask).
    anchor: scalar target, the same statistic of the initial policy.
    coef: SIREN's entropy_coeff (0.005).

  Returns:
    (scalar penalty, Hbar).
  """
  h_bar = aggregation.aggregate(entropy, token_mask, "seq-mean-token-mean")
  return coef * jnp.square(h_bar - anchor), h_bar


@functools.cache
def nucleus_entropy_fn(top_p: float):
  """`nucleus_entropy` at top_p as a policy.completion_logprobs per_token
  function: one object per top_p, so calls outside a jit reuse their
  compiled program."""
  return lambda z, _: nucleus_entropy(z, top_p)


# ----------------------------------------------------------------------------
# Lp-Reg.


def minp_proxy_logprobs(
  logits: jax.Array, targets: jax.Array, *, kappa: float = 0.02
) -> jax.Array:
  """log pi_proxy(target) with pi_proxy the min-p filtered, renormalised pi.

    keep_v = p_v >= kappa * max_u p_u,   pi_proxy(v) = p_v keep_v / Z,
    Z = sum_u p_u keep_u
  (authors' `apply_min_p`, regular_type="minp", minp_p_threshold = 0.02).
  Stop-gradient: the proxy is a fixed target.

  Args:
    logits: [..., V] scored logits of the rollout policy.
    targets: [...] token ids.
    kappa: min-p threshold.

  Returns:
    [...] log pi_proxy(target): -inf where the target is filtered out.
  """
  logp = jax.nn.log_softmax(sg(logits).astype(jnp.float32), axis=-1)
  keep = logp >= jnp.log(kappa) + logp.max(-1, keepdims=True)
  log_z = jax.nn.logsumexp(jnp.where(keep, logp, -jnp.inf), axis=-1)
  # The target by masked sums (no gather: V may be split over devices).
  vocab = jnp.arange(logp.shape[-1]).reshape((1,) * targets.ndim + (-1,))
  hit = vocab == targets[..., None]
  picked = jnp.sum(jnp.where(hit, logp, 0.0), axis=-1)
  kept = jnp.any(hit & keep, axis=-1)
  return jnp.where(kept, picked - log_z, -jnp.inf)


@functools.cache
def minp_proxy_fn(kappa: float):
  """`minp_proxy_logprobs` at kappa as a policy.completion_logprobs
  per_token function (one object per kappa, as nucleus_entropy_fn)."""
  return functools.partial(minp_proxy_logprobs, kappa=kappa)


def _lowest_k(logp: jax.Array, candidate: jax.Array, frac: float) -> jax.Array:
  """The max(floor(frac * #candidates), 1) candidates of lowest logp."""
  n = candidate.sum()
  k = jnp.maximum(jnp.floor(frac * n + 1e-4), 1.0)
  key = jnp.where(candidate, -sg(logp), -jnp.inf).reshape(-1)
  order = jnp.argsort(-key, stable=True)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(key.size))
  return candidate & (rank.reshape(logp.shape) < k) & (n > 0)


def lp_reg(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  proxy_logp: jax.Array,
  clip_eps_low: float = 0.2,
  clip_eps_high: float = 0.2,
  dual_clip: float | None = None,
  neg_frac: float = 0.01,
  pos_frac: float = 0.0,
  coef: float = 1.0,
  kl_value_clip: float | None = 10.0,
) -> tuple[jax.Array, losses.Metrics]:
  """PPO with a KL to the min-p proxy on shielded low-probability tokens.

  Lp-Reg (arXiv:2510.03222; authors' `compute_policy_loss_lp_reg`). The
  shielded tokens S are, among the valid tokens with A < 0 (and, if
  pos_frac > 0, separately among those with A > 0), the
  max(floor(frac * n), 1) of lowest logp whose proxy log-prob is above it
  (logp_t < log pi_proxy(y_t): the proxy keeps them). Then
    l_t = -A_t rho_t + coef * k3(logp_t, log pi_proxy(y_t))   t in S
    l_t = PPO's clipped surrogate                             otherwise
  with k3 = exp(-delta) + delta - 1, delta = logp - log pi_proxy (verl's
  low_var_kl, value clamped to +-10) on tokens sampled from pi_theta, the
  authors' KL term (an estimate of KL(pi_theta || pi_proxy)), whose
  gradient raises logp_t toward the proxy.
  Deviation: the authors skip the selection when floor(frac * n) <= 1.
  Statistics are over the batch passed in (as verl: the micro-batch).

  Args:
    logp, old_logp, adv, mask: as in losses.clipped_surrogate.
    proxy_logp: [N, T] log pi_proxy(y_t) (`minp_proxy_logprobs` of the
      rollout policy; -inf where filtered).
    clip_eps_low, clip_eps_high, dual_clip: PPO's clipping (the authors'
      scripts: 1.0 and 9.0, a very wide trust region; their loss applies
      no dual clip).
    neg_frac: fraction of negative-advantage tokens considered (0.01).
    pos_frac: the same for positive advantages (0 = none, the authors').
    coef: KL coefficient (ppo_kl_coef = 1).
    kl_value_clip: clamp of the k3 value (verl: 10), or None.

  Returns:
    (per-token loss [N, T], metrics of clipped_surrogate plus "lp_reg",
    the shielded-token indicator).
  """
  loss, metrics = losses.clipped_surrogate(
    logp,
    old_logp,
    adv,
    mask,
    clip_eps_low=clip_eps_low,
    clip_eps_high=clip_eps_high,
    dual_clip=dual_clip,
  )
  if adv.ndim == 1:
    adv = jnp.broadcast_to(adv[:, None], mask.shape)
  valid = mask > 0
  shielded = _lowest_k(logp, valid & (adv < 0), neg_frac)
  if pos_frac > 0:
    shielded |= _lowest_k(logp, valid & (adv > 0), pos_frac)
  shielded &= sg(logp) < proxy_logp
  # Double where: -inf proxies and garbage log-probs at mask = 0 never reach
  # a value or a gradient.
  lp = jnp.where(valid, logp, 0.0)
  safe_proxy = jnp.where(shielded, proxy_logp, sg(lp))
  log_ratio = jnp.where(valid, logp - old_logp, 0.0)
  kl_tok = kl.kl_k3(lp, safe_proxy, value_clip=kl_value_clip)
  reg = -adv * jnp.exp(log_ratio) + coef * kl_tok
  metrics["lp_reg"] = shielded.astype(jnp.float32)
  return jnp.where(shielded, reg, loss), metrics
