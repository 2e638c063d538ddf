"""The policy-gradient objective of the GRPO family, composed once.

Most paper methods are GRPO with a different advantage estimator, policy
loss, clip range, KL term, entropy term or aggregation. They share

  make_batch(rollout, examples, ctx) -> (batch, metrics)    host side
  loss_fn(params, batch, norm, *, cfg, model_cfg) -> (loss, metrics)

built here from `PGConfig` fields (advantages.get or returns.get,
losses.get_policy_loss, kl.get, aggregation.aggregate). The KL to the
reference goes into the loss (kl_coef, GRPO) or into the reward
(kl_reward_coef, RLOO, REINFORCE++).
An experiment subclasses `PGConfig` with its paper's defaults and either
uses these two functions as they are or wraps them:
`outcome_batch(..., adv_fn=...)` takes any advantage function, and
`pg_loss(..., token_weight=..., extra=...)` takes per-token weights (e.g.
forking tokens) and extra loss terms, so an experiment adds only what its
paper changes.

Batch keys read by `pg_loss`: tokens [N, P+T], positions [N, P+T],
mask [N, T], old_logp [N, T], adv [N] or [N, T], optionally ref_logp [N, T]
(when kl_coef > 0) and weight [N, T] (multiplies the per-token policy loss).
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import advantages
from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses
from rlreason.rl import pg_config
from rlreason.model import policy
from rlreason.rl import returns as returns_lib
from rlreason.rl import token_weights

# The estimators and the config the objective is built from.
OUTCOME_ESTIMATORS = pg_config.OUTCOME_ESTIMATORS
TOKEN_ESTIMATORS = pg_config.TOKEN_ESTIMATORS
PGConfig = pg_config.PGConfig


def outcome_advantages(
  rewards: np.ndarray,
  cfg,
  *,
  mask: np.ndarray | None = None,
  token_rewards: np.ndarray | None = None,
) -> np.ndarray:
  """Advantages of the outcome rewards with cfg.advantage.

  Args:
    rewards: [N] outcome rewards.
    cfg: a PGConfig.
    mask: [N, T] completion mask; needed by TOKEN_ESTIMATORS.
    token_rewards: optional [N, T] per-token rewards (the KL penalty of
      kl_reward_coef). Token estimators take them per token; outcome
      estimators add their sum to the outcome reward (the whole completion
      is one action, as RLOO's sequence-level KL reward).

  Returns:
    [N] (outcome estimators) or [N, T] (token estimators) advantages.
  """
  r = jnp.asarray(rewards, jnp.float32)
  if cfg.advantage in TOKEN_ESTIMATORS:
    fn = returns_lib.get(cfg.advantage)
    if mask is None:
      raise ValueError(f"--advantage={cfg.advantage} needs the mask")
    args = (r, jnp.asarray(mask))
    if cfg.advantage == "reinforce_plus_plus_baseline":
      args += (cfg.group_size,)
    tr = None if token_rewards is None else jnp.asarray(token_rewards)
    return np.asarray(fn(*args, token_rewards=tr))
  if token_rewards is not None:
    r = r + jnp.asarray(token_rewards, jnp.float32).sum(-1)
  kwargs = {}
  if cfg.advantage in ("grpo", "lite_ppo"):
    kwargs["eps"] = cfg.std_eps
  fn = advantages.get(cfg.advantage)
  return np.asarray(fn(r, cfg.group_size, **kwargs))


def kl_reward_penalty(batch: dict, cfg) -> np.ndarray:
  """[N, T] token rewards -kl_reward_coef * KL_t, 0 where mask = 0.

  KL_t compares the rollout-time policy (batch["old_logp"]) with the
  reference (batch["ref_logp"]), as verl's apply_kl_penalty and OpenRLHF.
  """
  kl_tok = kl.get(cfg.kl_reward_estimator)(
    jnp.asarray(batch["old_logp"]), jnp.asarray(batch["ref_logp"])
  )
  penalty = -cfg.kl_reward_coef * np.asarray(kl_tok, np.float32)
  return np.where(batch["mask"] > 0, penalty, 0.0).astype(np.float32)


def zero_truncated(rewards, rollout) -> np.ndarray:
  """[N] float32 rewards with 0 for completions cut at the token budget
  (no EOS): Dr. GRPO's "zero reward for truncated outputs", ORZ's
  "only correct and stopped responses acquire reward"."""
  cut = np.asarray(rollout.finish_reasons) != "eos"
  return np.where(cut, 0.0, np.asarray(rewards, np.float32)).astype(np.float32)


def correctness(rollout, examples, ctx) -> np.ndarray:
  """[N] 0/1 float32: the verifier (ctx.correct_fn) on every completion."""
  gold = [examples[i].answer for i in rollout.prompt_ids]
  return np.asarray(ctx.correct_fn(rollout.texts, gold), np.float32)


def reward_metrics(rewards, parts, rollout, examples, ctx) -> dict:
  """Reward, accuracy and group statistics every method logs."""
  grouped = np.asarray(rewards).reshape(-1, ctx.cfg.group_size)
  correct = correctness(rollout, examples, ctx) > 0
  # A non-finite reward makes these NaN, as they should read; the loop
  # counts and names such rewards itself (numpy's inf - inf warning aside).
  with np.errstate(invalid="ignore"):
    metrics = {
      "reward": grouped.mean(),
      "reward_std": grouped.std(-1).mean(),
      "accuracy": correct.mean(),
      "solved_all": (grouped.min(-1) == grouped.max(-1)).mean(),
    }
  # Length by outcome (Dr. GRPO's diagnostic: GRPO grows wrong answers).
  lengths = np.asarray(rollout.lengths, np.float32)
  for name, sel in (("correct", correct), ("incorrect", ~correct)):
    if sel.any():
      metrics[f"length/{name}"] = lengths[sel].mean()
  metrics.update({f"reward/{k}": np.mean(v) for k, v in parts.items()})
  return metrics


def outcome_batch(
  rollout,
  examples,
  ctx,
  *,
  adv_fn: Callable[[np.ndarray], np.ndarray] | None = None,
  rewards: tuple[np.ndarray, dict] | None = None,
) -> tuple[dict, dict]:
  """make_batch for outcome rewards: score, advantages, ref log-probs.

  Args:
    rollout, examples, ctx: as the loop passes them.
    adv_fn: rewards [N] -> advantages [N] or [N, T]; default
      `outcome_advantages(rewards, cfg)`.
    rewards: precomputed (rewards [N], parts), e.g. shaped by the caller;
      default `ctx.score(rollout, examples)`.
  """
  cfg = ctx.cfg
  total, parts = (
    rewards if rewards is not None else ctx.score(rollout, examples)
  )
  total = np.asarray(total, np.float32)
  batch = ctx.batch_from_rollout(rollout)
  mismatch = (
    correct_rollout(batch, rollout, ctx)
    if getattr(cfg, "rollout_correction", "")
    else {}
  )
  if cfg.needs_ref:
    batch["ref_logp"] = ctx.ref_logp(rollout)
  token_rewards = kl_reward_penalty(batch, cfg) if cfg.kl_reward_coef else None
  if adv_fn:
    adv = adv_fn(total)
  else:
    adv = outcome_advantages(
      total, cfg, mask=batch["mask"], token_rewards=token_rewards
    )
  batch["adv"] = np.asarray(adv, np.float32)
  metrics = reward_metrics(total, parts, rollout, examples, ctx)
  if token_rewards is not None:
    metrics["kl_reward"] = -token_rewards.sum() / max(
      cfg.kl_reward_coef * batch["mask"].sum(), 1e-9
    )
  metrics["adv_abs"] = np.abs(batch["adv"]).mean()
  metrics.update({f"mismatch/{k}": v for k, v in mismatch.items()})
  return batch, metrics


def correct_rollout(batch: dict, rollout, ctx) -> dict:
  """cfg.rollout_correction on a batch, in place: old_logp becomes the
  trainer's (unless batch_from_rollout already recomputed it), and the
  importance weights multiply batch["weight"]. Returns the mismatch
  metrics (token_weights.mismatch_metrics)."""
  cfg = ctx.cfg
  if batch["old_logp"] is batch["sampler_logp"]:
    batch["old_logp"] = ctx.trainer_logp(rollout)
  fn = {
    "tis": token_weights.truncated_is_weight,
    "mis": token_weights.masked_is_weight,
  }[cfg.rollout_correction]
  w = np.asarray(
    fn(
      jnp.asarray(batch["old_logp"]),
      jnp.asarray(batch["sampler_logp"]),
      jnp.asarray(batch["mask"]),
      cap=cfg.rollout_correction_cap,
      level=cfg.rollout_correction_level,
    ),
    np.float32,
  )
  batch["weight"] = w * batch["weight"] if "weight" in batch else w
  return token_weights.mismatch_metrics(
    batch["old_logp"], batch["sampler_logp"], batch["mask"], w
  )


def make_batch(rollout, examples, ctx):
  """The default make_batch: `outcome_batch` with cfg.advantage."""
  return outcome_batch(rollout, examples, ctx)


def drop_groups(batch: dict, keep: np.ndarray, group_size: int) -> dict:
  """Takes the groups with keep[b] False out of the update.

  Their mask and advantages are zeroed, so they weigh nothing in any loss
  or normaliser while the batch keeps its [N, ...] shapes (filters such as
  RLPR's std filter or EMPO's entropy threshold).

  Args:
    batch: make_batch's dict with "mask" [N, T] and "adv" [N] or [N, T].
    keep: [B] bool, N = B * G prompt-major.
    group_size: G.
  """
  rows = np.repeat(np.asarray(keep, bool), group_size)
  out = dict(batch)
  out["mask"] = np.where(rows[:, None], batch["mask"], 0).astype(
    batch["mask"].dtype
  )
  adv = np.asarray(batch["adv"])
  shape = (-1,) + (1,) * (adv.ndim - 1)
  out["adv"] = np.where(rows.reshape(shape), adv, 0.0).astype(np.float32)
  return out


def policy_loss_fn(cfg) -> losses.PolicyLoss:
  """cfg.policy_loss with its clip range bound."""
  fn = losses.get_policy_loss(cfg.policy_loss)
  if cfg.policy_loss in ("ppo", "gspo", "cispo"):
    fn = functools.partial(
      fn, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high
    )
  if getattr(cfg, "dual_clip", 0.0):
    fn = functools.partial(fn, dual_clip=cfg.dual_clip)
  return fn


def completion_forward(params, batch: dict, *, cfg, model_cfg, per_token=()):
  """(logp [N, T], entropy [N, T]) of the batch's completions under `params`.

  Scored at cfg.temperature, as `pg_loss` scores them; with `per_token`
  functions of the scored logits (policy.completion_logprobs), also their
  [N, T] values, for a loss that needs the whole distribution and passes
  (logp, entropy) to pg_loss's `forward`.
  """
  return policy.completion_logprobs(
    params,
    batch["tokens"],
    batch["positions"],
    model_cfg,
    batch["tokens"].shape[1] - batch["mask"].shape[1],
    temperature=cfg.temperature,
    with_entropy=True,
    per_token=per_token,
  )


def pg_loss(
  params,
  batch: dict,
  norm: dict,
  *,
  cfg,
  model_cfg,
  token_weight: Callable[..., jax.Array] | None = None,
  extra: Callable[..., tuple[jax.Array, dict]] | None = None,
  policy_loss: losses.PolicyLoss | None = None,
  forward: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, Any]]:
  """Policy loss + kl_coef * KL - entropy_coef * H, aggregated once.

  Args:
    params, batch, norm: as train_step passes them.
    cfg: a PGConfig.
    model_cfg: the model's config.
    token_weight: optional fn(logp, entropy, batch) -> [N, T] weights that
      multiply the per-token policy loss (e.g. forking tokens).
    extra: optional fn(logp, entropy, batch) -> (per_token [N, T], metrics),
      added to the per-token loss before aggregation.
    policy_loss: overrides `policy_loss_fn(cfg)`.
    forward: optional (logp [N, T], entropy [N, T]) already computed from
      `params` by the caller (`completion_forward`), e.g. together with the
      per_token values a regulariser needs; the hooks may close over them.

  Returns:
    (scalar loss, metrics) with entropy, clipfrac, approx_kl (and kl).
  """
  mask = batch["mask"]
  logp, entropy = forward or completion_forward(
    params, batch, cfg=cfg, model_cfg=model_cfg
  )
  fn = policy_loss or policy_loss_fn(cfg)
  per_token, m = fn(logp, batch["old_logp"], batch["adv"], mask)
  if "weight" in batch:
    per_token = per_token * batch["weight"]
  if token_weight is not None:
    per_token = per_token * token_weight(logp, entropy, batch)
  metrics = {}
  if cfg.kl_coef:
    kl_tok = kl.get(cfg.kl_estimator)(logp, batch["ref_logp"])
    per_token = per_token + cfg.kl_coef * kl_tok
    metrics["kl"] = aggregation.aggregate(kl_tok, mask)
  if cfg.entropy_coef:
    per_token = per_token + losses.entropy_bonus(
      entropy, mask, coef=cfg.entropy_coef
    )
  if extra is not None:
    extra_tok, extra_metrics = extra(logp, entropy, batch)
    per_token = per_token + extra_tok
    metrics.update(extra_metrics)
  loss = aggregation.aggregate(
    per_token, mask, cfg.aggregation, max_len=mask.shape[1], **norm
  )
  metrics["entropy"] = aggregation.aggregate(entropy, mask)
  for k in ("clipfrac", "approx_kl"):
    if k in m:
      metrics[k] = aggregation.aggregate(m[k], mask)
  return loss, metrics


def loss_fn(params, batch, norm, *, cfg, model_cfg):
  """The default loss_fn: `pg_loss` with nothing added."""
  return pg_loss(params, batch, norm, cfg=cfg, model_cfg=model_cfg)
