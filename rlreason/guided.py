"""Guided re-sampling: hinted rollouts for the groups that need them.

The make_batch of hint-guided methods (Guide, GHPO, POPE, SEELE, KnowRL):

  round 0   the loop's rollout of the plain prompts;
  stage s   for every prompt selected (by default: its group so far has no
            correct answer), a hinted copy from `hint_fns[s](example, ctx)`
            is sampled again (allocation.sample_again: the whole batch of B
            prompts, so shapes stay fixed) and its group REPLACES the
            prompt's group (an all-wrong group has zero advantage under a
            group baseline: nothing is lost);
  then      rewards -> advantages (objective.outcome_advantages) on the
            mixed groups; ref log-probs on the mixed tokens.

With `unhinted_context=True` (Guide) the hinted rows are re-attached to the
hint-free prompt (hints.unhinted_batch), so the loss optimises
pi_theta(o | q) with behaviour pi_old(o | q, h); otherwise (GHPO, POPE,
SEELE) the hinted rows are trained on-policy in their hinted context.
Metrics: `accuracy` etc. of round 0 (the unguided policy), guided/groups
(fraction of groups replaced), guided/accuracy (accuracy of those rows).
"""

from typing import Callable, Sequence

import numpy as np

from rlreason import allocation
from rlreason import guidance
from rlreason import hints
from rlreason import mesh as mesh_lib
from rlreason import objective
from rlreason import policy

# (example, ctx) -> a hinted copy, or None for no hint.
HintFn = Callable[..., object]


def batch_ref_logp(batch: dict, ctx) -> np.ndarray:
  """[N, T] reference log-probs of a batch's own tokens (any context)."""
  mask = batch["mask"]
  return mesh_lib.to_host(
    policy.completion_logprobs(
      ctx.ref_params,
      batch["tokens"],
      batch["positions"],
      ctx.model_cfg,
      batch["tokens"].shape[1] - mask.shape[1],
      temperature=ctx.cfg.temperature,
    )
  )


def unsolved(correct: np.ndarray, group_size: int) -> np.ndarray:
  """[B] bool: groups with no correct answer."""
  return np.asarray(correct).reshape(-1, group_size).max(-1) <= 0


def guided_rollouts(
  rollout,
  examples: Sequence,
  ctx,
  hint_fns: Sequence[HintFn],
  *,
  unhinted_context: bool = False,
  select: str = "unsolved",
  on_round: Callable | None = None,
):
  """Round 0 plus hinted stages (module doc).

  Args:
    rollout, examples, ctx: as the loop passes them to make_batch.
    hint_fns: one hint function per stage.
    unhinted_context: re-attach hinted rows to the hint-free prompt.
    select: "unsolved" (groups with no correct answer so far) or "all".
    on_round: optional fn(rollout, examples, correct [N], stage) called
      for every sampled round (e.g. to record hint accuracies).

  Returns:
    (batch, rewards [N], parts, hinted [N] bool rows).
  """
  g = ctx.cfg.group_size
  total, parts = ctx.score(rollout, examples)
  total = np.array(total, np.float32)
  parts = {k: np.array(v, np.float32) for k, v in parts.items()}
  correct = objective.correctness(rollout, examples, ctx)
  if on_round is not None:
    on_round(rollout, examples, correct, -1)
  batch = ctx.batch_from_rollout(rollout)
  hinted_rows = np.zeros(len(total), bool)
  for stage, hint_fn in enumerate(hint_fns):
    want = (
      unsolved(correct, g)
      if select == "unsolved"
      else np.ones(len(examples), bool)
    )
    new = [hint_fn(e, ctx) if w else None for e, w in zip(examples, want)]
    take = np.asarray([h is not None for h in new])
    if not take.any():
      break
    mixed = [h if h is not None else e for h, e in zip(new, examples)]
    ro = allocation.sample_again(ctx, mixed, stage)
    b2 = ctx.batch_from_rollout(ro)
    if unhinted_context:
      b2 = hints.unhinted_batch(b2, ro, mixed, ctx)
    t2, p2 = ctx.score(ro, mixed)
    c2 = objective.correctness(ro, mixed, ctx)
    if on_round is not None:
      on_round(ro, mixed, c2, stage)
    rows = np.flatnonzero(np.repeat(take, g))
    b2 = {k: np.asarray(v)[rows] for k, v in b2.items()}
    batch = guidance.replace_rows(
      batch,
      rows,
      {**b2, "off_policy": np.full(len(rows), unhinted_context)},
      ctx.tokenizer.pad_id,
    )
    total[rows] = np.asarray(t2)[rows]
    for k in parts:
      parts[k][rows] = np.asarray(p2[k])[rows]
    correct[rows] = c2[rows]
    hinted_rows[rows] = True
  return batch, total, parts, hinted_rows


def make_batch(
  hint_fns: Sequence[HintFn],
  *,
  unhinted_context: bool = False,
  select: str = "unsolved",
  on_round: Callable | None = None,
) -> Callable:
  """A make_batch: `guided_rollouts`, then GRPO-family advantages."""

  def fn(rollout, examples, ctx):
    cfg = ctx.cfg
    batch, total, parts, hinted_rows = guided_rollouts(
      rollout,
      examples,
      ctx,
      hint_fns,
      unhinted_context=unhinted_context,
      select=select,
      on_round=on_round,
    )
    if cfg.needs_ref:
      batch["ref_logp"] = batch_ref_logp(batch, ctx)
    batch["adv"] = np.asarray(
      objective.outcome_advantages(total, cfg, mask=batch["mask"]),
      np.float32,
    )
    batch.setdefault("off_policy", np.zeros(len(total), np.float32))
    batch["off_policy"] = batch["off_policy"].astype(np.float32)
    r0, _ = ctx.score(rollout, examples)
    metrics = objective.reward_metrics(r0, {}, rollout, examples, ctx)
    metrics["guided/groups"] = float(hinted_rows.mean())
    if hinted_rows.any():
      metrics["guided/reward"] = float(total[hinted_rows].mean())
    metrics["adv_abs"] = float(np.abs(batch["adv"]).mean())
    return batch, metrics

  return fn
