"""Off-policy guidance: stored or teacher traces mixed into groups.

Mixed-policy methods (LUFFY, arXiv:2504.14945; AMPO, arXiv:2510.02227;
Guide, arXiv:2506.13923) put completions the policy did not sample into a
group: reference solutions, a teacher's samples, or samples from a hinted
prompt. They share three steps:

  traces = guidance.trace_batch(ctx, examples, texts, behavior="policy")
  batch = guidance.replace_rows(batch, rows, traces, pad_id)  # into groups
  loss: guidance.mixed_policy_loss(..., off_policy=batch["off_policy"])

`trace_batch` encodes completions like a rollout (prompt left padded,
completion + EOS, [N, P + T]) with behaviour log-probs "old_logp": the
current policy's ("policy": ratio 1 at the first update, the on-policy
treatment), a teacher's (pass `behavior_logp`), or 0 ("one": LUFFY's
pi_phi = 1 for traces without log-probs). Rows carry "off_policy" = 1.

`mixed_policy_loss` is the clipped PPO surrogate on on-policy rows and, on
off-policy rows, an importance-weighted policy gradient with the ratio
r = pi_theta / pi_behaviour either capped (r <- min(r, max_ratio),
truncated IS) or shaped (f(r) = r / (r + gamma), LUFFY's policy shaping
that keeps gradients on low-probability tokens), never PPO-clipped (the
behaviour policy is not the old policy).
"""

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import losses
from rlreason.rl import objective
from rlreason.sampling import padding


def encode_traces(
  prompts: Sequence[Sequence[int]],
  completions: Sequence[Sequence[int]],
  *,
  pad_id: int,
  max_new_tokens: int,
  max_prompt_len: int | None = None,
) -> dict[str, np.ndarray]:
  """tokens, positions [N, P + T], mask [N, T] for given completions.

  Prompts are left padded (padding.pad_prompts); completions (ids ending
  with EOS) are truncated to T = max_new_tokens and right padded with
  position -1, as a rollout.
  """
  tokens, positions = padding.pad_prompts(
    prompts, pad_id, max_len=max_prompt_len
  )
  n, t = len(completions), max_new_tokens
  comp = np.full((n, t), pad_id, np.int32)
  mask = np.zeros((n, t), np.float32)
  comp_pos = np.full((n, t), -1, np.int32)
  start = positions[:, -1] + 1
  for i, c in enumerate(completions):
    c = list(c)[:t]
    comp[i, : len(c)] = c
    mask[i, : len(c)] = 1
    comp_pos[i, : len(c)] = start[i] + np.arange(len(c))
  return {
    "tokens": np.concatenate([tokens, comp], 1).astype(np.int32),
    "positions": np.concatenate([positions, comp_pos], 1).astype(np.int32),
    "mask": mask,
  }


def trace_batch(
  ctx,
  examples,
  texts: Sequence[str],
  *,
  behavior: str = "policy",
  behavior_logp: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
  """A batch of rows for given completion texts of `examples` (one each).

  Args:
    ctx: the loop's Context (tokenizer, cfg, params).
    examples: N examples (their hinted prompt if hinted).
    texts: N completion texts (EOS is appended).
    behavior: "policy" (log-probs under ctx.params), "one" (0), or
      "given" (`behavior_logp`).
    behavior_logp: [N, T] behaviour log-probs for "given".

  Returns:
    tokens, positions, mask, old_logp, sampler_logp, off_policy [N].
  """
  tok, cfg = ctx.tokenizer, ctx.cfg
  batch = encode_traces(
    ctx.encode_prompts(examples),
    [tok.encode(t) + [tok.eos_id] for t in texts],
    pad_id=tok.pad_id,
    max_new_tokens=cfg.max_new_tokens,
  )
  if behavior == "policy":
    logp = ctx.completion_scores(
      ctx.params,
      jnp.asarray(batch["tokens"]),
      jnp.asarray(batch["positions"]),
      batch["tokens"].shape[1] - cfg.max_new_tokens,
    )
  elif behavior == "one":
    logp = np.zeros_like(batch["mask"])
  elif behavior == "given":
    logp = np.asarray(behavior_logp)
  else:
    raise ValueError(f"behavior={behavior!r}: policy, one or given")
  logp = np.where(batch["mask"] > 0, logp, 0.0).astype(np.float32)
  batch["old_logp"] = batch["sampler_logp"] = logp
  batch["off_policy"] = np.ones(len(texts), np.float32)
  return batch


def _pad_left(x: np.ndarray, width: int, fill) -> np.ndarray:
  if x.shape[1] == width:
    return x
  pad = np.full((x.shape[0], width - x.shape[1]), fill, x.dtype)
  return np.concatenate([pad, x], 1)


def replace_rows(
  batch: dict, rows: np.ndarray, other: dict, pad_id: int
) -> dict:
  """`batch` with rows[j] replaced by other's row j.

  "tokens" / "positions" of different prompt widths are left padded to the
  wider (pad_id, position -1). A key of `batch` missing from `other` gets
  zeros in the replaced rows; "off_policy" [N] is added (0) if missing.
  """
  rows = np.asarray(rows, np.int64)
  out = {k: np.array(v) for k, v in batch.items()}
  n = len(out["mask"])
  out.setdefault("off_policy", np.zeros(n, np.float32))
  width = max(out["tokens"].shape[1], other["tokens"].shape[1])
  for k in out:
    v = out[k]
    o = np.asarray(other[k]) if k in other else None
    if k in ("tokens", "positions"):
      fill = pad_id if k == "tokens" else -1
      v = _pad_left(v, width, fill)
      o = _pad_left(o, width, fill)
    if o is None:
      v[rows] = 0
    else:
      v[rows] = o.astype(v.dtype)
    out[k] = v
  return out


def mixed_policy_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  off_policy: jax.Array,
  clip_eps_low: float = 0.2,
  clip_eps_high: float = 0.2,
  dual_clip: float | None = None,
  shaping_gamma: float = 0.0,
  max_ratio: float = 1.0,
  gamma_quantile: float = 0.0,
):
  """PPO on on-policy rows, importance-weighted PG on off-policy rows.

  On-policy rows: losses.clipped_surrogate. Off-policy rows, with
  r = exp(logp - old_logp) (old_logp: the behaviour policy's):
    shaping_gamma > 0:  l = -A * r / (r + gamma)  (LUFFY Eq. 6)
    gamma_quantile > 0: the same with gamma = the gamma_quantile-quantile
                        of r over the off-policy tokens, no gradient, at
                        least 1e-4 (Guide's "percentile" strategy)
    else:               l = -A * min(r, max_ratio)  (truncated IS)
  The weight keeps its gradient (no stop-gradient): d l / d logp =
  -A * f'(r) r.

  Args:
    logp, old_logp: [N, T].
    adv: [N] or [N, T].
    mask: [N, T].
    off_policy: [N] 1 for off-policy rows.
    clip_eps_low, clip_eps_high: PPO's clip range (on-policy rows).
    dual_clip: the on-policy rows' dual clip (losses.clipped_surrogate;
      AMPO's clip_ratio_c); None = off.
    shaping_gamma: gamma of the shaping; 0 = capped ratio.
    max_ratio: cap of the ratio without shaping.
    gamma_quantile: q of the quantile gamma (in (0, 1]); 0 = off.

  Returns:
    (per-token loss [N, T], metrics [N, T]: clipfrac, approx_kl,
    offpolicy_ratio (r on off-policy rows, 0 elsewhere)).
  """
  on_tok, m = losses.clipped_surrogate(
    logp,
    old_logp,
    adv,
    mask,
    clip_eps_low=clip_eps_low,
    clip_eps_high=clip_eps_high,
    dual_clip=dual_clip,
  )
  a = adv if adv.ndim == 2 else adv[:, None]
  r = jnp.exp(jnp.clip(logp - old_logp, -20.0, 20.0))
  off = off_policy[:, None] > 0
  if gamma_quantile > 0:
    sel = off & (mask > 0)
    q = jnp.nanquantile(jnp.where(sel, r, jnp.nan), gamma_quantile)
    gamma = jax.lax.stop_gradient(
      jnp.where(sel.any(), jnp.maximum(q, 1e-4), 1.0)
    )
    w = r / (r + gamma)
  elif shaping_gamma > 0:
    w = r / (r + shaping_gamma)
  else:
    w = jnp.minimum(r, max_ratio)
  off_tok = -a * w
  per_token = jnp.where(off, off_tok, on_tok) * mask
  metrics = {
    "clipfrac": jnp.where(off, 0.0, m["clipfrac"]),
    "approx_kl": jnp.where(off, 0.0, m["approx_kl"]),
    "offpolicy_ratio": jnp.where(off, r, 0.0),
  }
  return per_token, metrics


def mixed_pg_loss(params, batch, norm, *, cfg, model_cfg, **shaping):
  """objective.pg_loss with `mixed_policy_loss`: batch["off_policy"]'s
  rows importance-weighted, the others PPO-clipped at cfg's range (and
  --dual_clip); `shaping`: shaping_gamma, gamma_quantile or max_ratio."""
  policy_loss = functools.partial(
    mixed_policy_loss,
    off_policy=batch["off_policy"],
    clip_eps_low=cfg.clip_eps_low,
    clip_eps_high=cfg.clip_eps_high,
    dual_clip=cfg.dual_clip or None,
    **shaping,
  )
  return objective.pg_loss(
    params, batch, norm, cfg=cfg, model_cfg=model_cfg, policy_loss=policy_loss
  )
