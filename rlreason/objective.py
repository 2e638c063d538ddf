"""The policy-gradient objective of the GRPO family, composed once.

Most paper methods are GRPO with a different advantage estimator, policy
loss, clip range, KL term, entropy term or aggregation. They share

  make_batch(rollout, examples, ctx) -> (batch, metrics)    host side
  loss_fn(params, batch, norm, *, cfg, model_cfg) -> (loss, metrics)

built here from `PGConfig` fields (advantages.get, losses.get_policy_loss,
kl.get, losses.aggregate). An experiment subclasses `PGConfig` with its
paper's defaults and either uses these two functions as they are or wraps
them: `outcome_batch(..., adv_fn=...)` takes any advantage function, and
`pg_loss(..., token_weight=..., extra=...)` takes per-token weights (e.g.
forking tokens) and extra loss terms, so an experiment adds only what its
paper changes.

Batch keys read by `pg_loss`: tokens [N, P+T], positions [N, P+T],
mask [N, T], old_logp [N, T], adv [N] or [N, T], optionally ref_logp [N, T]
(when kl_coef > 0) and weight [N, T] (multiplies the per-token policy loss).
"""

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import advantages
from rlreason import config
from rlreason import kl
from rlreason import losses
from rlreason import policy

# Outcome estimators with the signature (rewards [N], group_size, **kw).
OUTCOME_ESTIMATORS = (
  "grpo",
  "dr_grpo",
  "lite_ppo",
  "rloo",
  "gpg",
  "max_minus_second",
)


@dataclasses.dataclass(frozen=True)
class PGConfig(config.BaseConfig):
  """The knobs of the GRPO-family objective (GRPO's values by default)."""

  advantage: str = "grpo"  # one of OUTCOME_ESTIMATORS
  std_eps: float = 1e-6  # added to the group std (verl's value)
  policy_loss: str = "ppo"  # losses.get_policy_loss name
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  kl_coef: float = 0.0  # beta of the KL-to-reference loss term; 0 = off
  kl_estimator: str = "k3"  # kl.get name
  entropy_coef: float = 0.0  # entropy bonus coefficient; 0 = off
  aggregation: str = "seq-mean-token-mean"  # losses.AGGREGATION_MODES

  def validate(self) -> None:
    super().validate()
    if self.advantage not in OUTCOME_ESTIMATORS:
      raise ValueError(
        f"Invalid config: --advantage={self.advantage!r}; the shared "
        f"objective takes one of {OUTCOME_ESTIMATORS} (token-level "
        "estimators need their own make_batch)"
      )
    losses.get_policy_loss(self.policy_loss)
    kl.get(self.kl_estimator)
    if self.aggregation not in losses.AGGREGATION_MODES:
      raise ValueError(
        f"Invalid config: --aggregation={self.aggregation!r}; valid: "
        f"{losses.AGGREGATION_MODES}"
      )
    if self.group_size < 2 and self.advantage != "lite_ppo":
      raise ValueError(
        f"Invalid config: --advantage={self.advantage} compares the "
        f"completions of a group, so --group_size must be >= 2 (got "
        f"{self.group_size})"
      )


def outcome_advantages(rewards: np.ndarray, cfg) -> np.ndarray:
  """[N] advantages of the outcome rewards with cfg.advantage."""
  fn = advantages.get(cfg.advantage)
  kwargs = {}
  if cfg.advantage in ("grpo", "lite_ppo"):
    kwargs["eps"] = cfg.std_eps
  return np.asarray(fn(jnp.asarray(rewards), cfg.group_size, **kwargs))


def reward_metrics(rewards, parts, rollout, examples, ctx) -> dict:
  """Reward, accuracy and group statistics every method logs."""
  grouped = np.asarray(rewards).reshape(-1, ctx.cfg.group_size)
  gold = [examples[i].answer for i in rollout.prompt_ids]
  metrics = {
    "reward": grouped.mean(),
    "reward_std": grouped.std(-1).mean(),
    "accuracy": np.mean(ctx.correct_fn(rollout.texts, gold)),
    "solved_all": (grouped.min(-1) == grouped.max(-1)).mean(),
  }
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
  batch["adv"] = np.asarray(
    adv_fn(total) if adv_fn else outcome_advantages(total, cfg), np.float32
  )
  if cfg.kl_coef:
    batch["ref_logp"] = ctx.ref_logp(rollout)
  metrics = reward_metrics(total, parts, rollout, examples, ctx)
  metrics["adv_abs"] = np.abs(batch["adv"]).mean()
  return batch, metrics


def make_batch(rollout, examples, ctx):
  """The default make_batch: `outcome_batch` with cfg.advantage."""
  return outcome_batch(rollout, examples, ctx)


def policy_loss_fn(cfg) -> losses.PolicyLoss:
  """cfg.policy_loss with its clip range bound."""
  fn = losses.get_policy_loss(cfg.policy_loss)
  if cfg.policy_loss in ("ppo", "gspo", "cispo"):
    fn = functools.partial(
      fn, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high
    )
  return fn


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

  Returns:
    (scalar loss, metrics) with entropy, clipfrac, approx_kl (and kl).
  """
  mask = batch["mask"]
  prompt_len = batch["tokens"].shape[1] - mask.shape[1]
  logp, entropy = policy.completion_logprobs(
    params,
    batch["tokens"],
    batch["positions"],
    model_cfg,
    prompt_len,
    temperature=cfg.temperature,
    with_entropy=True,
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
    metrics["kl"] = losses.aggregate(kl_tok, mask)
  if cfg.entropy_coef:
    per_token = per_token + losses.entropy_bonus(
      entropy, mask, coef=cfg.entropy_coef
    )
  if extra is not None:
    extra_tok, extra_metrics = extra(logp, entropy, batch)
    per_token = per_token + extra_tok
    metrics.update(extra_metrics)
  loss = losses.aggregate(
    per_token, mask, cfg.aggregation, max_len=mask.shape[1], **norm
  )
  metrics["entropy"] = losses.aggregate(entropy, mask)
  for k in ("clipfrac", "approx_kl"):
    if k in m:
      metrics[k] = losses.aggregate(m[k], mask)
  return loss, metrics


def loss_fn(params, batch, norm, *, cfg, model_cfg):
  """The default loss_fn: `pg_loss` with nothing added."""
  return pg_loss(params, batch, norm, cfg=cfg, model_cfg=model_cfg)
