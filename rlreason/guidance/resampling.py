"""Guided re-sampling: hinted rollouts for the groups that need them.

The make_batch of hint-guided methods (Guide, GHPO, POPE, SEELE, KnowRL):

  round 0   the loop's rollout of the plain prompts;
  stage s   for every prompt selected (by default: its group so far has no
            correct answer), a hinted copy from `hint_fns[s](example, ctx)`
            is sampled again (allocation.sample_again on the selected
            prompts only, padded to a power of two so that few shapes
            compile) and its group REPLACES the prompt's group (an all-wrong
            group has zero advantage under a group baseline: nothing is
            lost);
  then      rewards -> advantages (objective.outcome_advantages) on the
            mixed groups; ref log-probs on the mixed tokens.

With `unhinted_context=True` (Guide) the hinted rows are re-attached to the
hint-free prompt (hints.unhinted_batch), so the loss optimises
pi_theta(o | q) with behaviour pi_old(o | q, h); otherwise (GHPO, POPE,
SEELE) the hinted rows are trained on-policy in their hinted context.
`rescore=True` in addition recomputes old_logp under the hint-free prompt,
log pi_old(o | q): the rows then count as on-policy samples of q (ratio 1
at the first update) although they were drawn with the hint.

Partial replacement (`replace=k`, EGSR, arXiv:2505.08364): instead of the
whole group, at most k rows of the hinted group (with `correct_only`, only
its verified-correct rows) replace the LAST k rows of the prompt's group
(`replacement_rows`); its first G - k rows, the policy's own failures,
stay. The group baseline then gives the guided successes
A = (1 - k/G) / std > 0 and the failures a negative advantage, where a
wholly replaced group of all-correct hinted samples would give 0.

Metrics: `accuracy` etc. of round 0 (the unguided policy), guided/groups
(fraction of groups with replaced rows), guided/rows (fraction of rows),
guided/reward (mean reward of the replaced rows), guided/hint_accuracy
(accuracy of all hinted samples of the selected groups, before selection).
"""

from typing import Callable, Sequence

import numpy as np

from rlreason.data import allocation
from rlreason.guidance import offpolicy as guidance
from rlreason.guidance import hints
from rlreason.rl import objective

# (example, ctx) -> a hinted copy, or None for no hint.
HintFn = Callable[..., object]


def _logp(batch: dict, ctx, params) -> np.ndarray:
  return ctx.completion_scores(
    params,
    batch["tokens"],
    batch["positions"],
    batch["tokens"].shape[1] - batch["mask"].shape[1],
  )


def batch_ref_logp(batch: dict, ctx) -> np.ndarray:
  """[N, T] reference log-probs of a batch's own tokens (any context)."""
  return _logp(batch, ctx, ctx.ref_params)


def batch_logp(batch: dict, ctx) -> np.ndarray:
  """[N, T] log-probs of a batch's own tokens under the current policy
  (ctx.params), in the batch's context."""
  return _logp(batch, ctx, ctx.params)


def unsolved(correct: np.ndarray, group_size: int) -> np.ndarray:
  """[B] bool: groups with no correct answer."""
  return np.asarray(correct).reshape(-1, group_size).max(-1) <= 0


def replacement_rows(
  take: np.ndarray,
  correct: np.ndarray,
  group_size: int,
  replace: int | None = None,
  *,
  correct_only: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Which rows of a hinted round replace which rows of the batch.

  Rows are b * G + j (group b, sample j) in both rounds.

  Args:
    take: [B] bool, the groups that receive hinted rows.
    correct: [N] 0/1 correctness of the hinted round.
    group_size: G.
    replace: rows per group; None = the whole group, row for row.
    correct_only: only the hinted round's correct rows are used.

  Returns:
    (dst, src) [M] int: batch row dst[m] gets hinted row src[m]. Group b's
    sources are its first usable hinted rows, in order; its destinations
    are its last rows, from G - 1 down.

  Example: take [T, T], correct [0, 1, 1, 0, 0, 0, 0, 1], G = 4,
  replace = 1, correct_only -> dst [3, 7], src [1, 7].
  """
  g = group_size
  ok = np.asarray(correct).reshape(-1, g) > 0
  k = g if replace is None else min(max(replace, 0), g)
  dst, src = [], []
  for b in np.flatnonzero(np.asarray(take, bool)):
    usable = np.flatnonzero(ok[b]) if correct_only else np.arange(g)
    usable = usable[:k]
    if replace is None and not correct_only:
      dst += [b * g + j for j in range(g)]
    else:
      dst += [b * g + g - 1 - r for r in range(len(usable))]
    src += [b * g + j for j in usable]
  return np.asarray(dst, np.int64), np.asarray(src, np.int64)


def subset_bucket(n: int, total: int) -> int:
  """Prompts to sample for n selected of `total`: the next power of two,
  at most `total` (so a stage compiles one of log2(B) + 1 shapes)."""
  return min(total, 1 << max(n - 1, 0).bit_length())


def guided_rollouts(
  rollout,
  examples: Sequence,
  ctx,
  hint_fns: Sequence[HintFn],
  *,
  unhinted_context: bool = False,
  rescore: bool = False,
  select: str = "unsolved",
  replace: int | None = None,
  correct_only: bool = False,
  on_round: Callable | None = None,
  stats: dict | None = None,
):
  """Round 0 plus hinted stages (module doc).

  Args:
    rollout, examples, ctx: as the loop passes them to make_batch.
    hint_fns: one hint function per stage.
    unhinted_context: re-attach hinted rows to the hint-free prompt.
    rescore: with unhinted_context, old_logp under the hint-free prompt
      (on-policy treatment) instead of the hinted behaviour's.
    select: "unsolved" (groups with no correct answer so far) or "all".
    replace, correct_only: which hinted rows replace which rows
      (`replacement_rows`); default: whole groups.
    on_round: optional fn(rollout, examples, correct, stage) called for
      every sampled round (e.g. to record hint accuracies); stage -1 is
      round 0 (all B prompts), a hinted stage passes its hinted examples
      and their correctness (its rollout may hold padding rows after
      them).
    stats: optional dict; "hinted" / "hinted_correct" (hinted samples of
      the selected groups, and how many were correct) are added to it.

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
    sel = np.flatnonzero([h is not None for h in new])
    if not len(sel):
      break
    # The hinted prompts only, padded (repeats of the first) to a bucket;
    # local group j is batch group sel[j] for j < n_sel.
    n_sel = len(sel)
    padded = np.full(subset_bucket(n_sel, len(examples)), sel[0])
    padded[:n_sel] = sel
    sub = [new[i] for i in padded]
    ro = allocation.sample_again(ctx, sub, stage)
    b2 = ctx.batch_from_rollout(ro)
    if unhinted_context:
      b2 = hints.unhinted_batch(b2, ro, sub, ctx)
    t2, p2 = ctx.score(ro, sub)
    c2 = objective.correctness(ro, sub, ctx)
    if on_round is not None:
      on_round(ro, sub[:n_sel], c2[: n_sel * g], stage)
    if stats is not None:
      stats["hinted"] = stats.get("hinted", 0) + n_sel * g
      stats["hinted_correct"] = stats.get("hinted_correct", 0) + int(
        (c2[: n_sel * g] > 0).sum()
      )
    take = np.arange(len(sub)) < n_sel
    dst, src = replacement_rows(take, c2, g, replace, correct_only=correct_only)
    if not len(dst):
      continue
    dst = sel[dst // g] * g + dst % g  # local -> batch rows
    b2 = {k: np.asarray(v)[src] for k, v in b2.items()}
    off = unhinted_context and not rescore
    batch = guidance.replace_rows(
      batch,
      dst,
      {**b2, "off_policy": np.full(len(dst), off, np.float32)},
      ctx.tokenizer.pad_id,
    )
    if unhinted_context and rescore:
      # On the merged batch: its width is round 0's, one compiled shape.
      lp = np.where(batch["mask"] > 0, batch_logp(batch, ctx), 0.0)
      batch["old_logp"][dst] = lp[dst]
    total[dst] = np.asarray(t2)[src]
    for k in parts:
      parts[k][dst] = np.asarray(p2[k])[src]
    correct[dst] = c2[src]
    hinted_rows[dst] = True
  return batch, total, parts, hinted_rows


def make_batch(
  hint_fns: Sequence[HintFn],
  *,
  unhinted_context: bool = False,
  rescore: bool = False,
  select: str = "unsolved",
  replace: int | None = None,
  correct_only: bool = False,
  on_round: Callable | None = None,
) -> Callable:
  """A make_batch: `guided_rollouts`, then GRPO-family advantages."""

  def fn(rollout, examples, ctx):
    cfg = ctx.cfg
    stats = {}
    batch, total, parts, hinted_rows = guided_rollouts(
      rollout,
      examples,
      ctx,
      hint_fns,
      unhinted_context=unhinted_context,
      rescore=rescore,
      select=select,
      replace=replace,
      correct_only=correct_only,
      on_round=on_round,
      stats=stats,
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
    g = cfg.group_size
    metrics["guided/groups"] = float(hinted_rows.reshape(-1, g).any(-1).mean())
    metrics["guided/rows"] = float(hinted_rows.mean())
    if hinted_rows.any():
      metrics["guided/reward"] = float(total[hinted_rows].mean())
    if stats.get("hinted"):
      metrics["guided/hint_accuracy"] = (
        stats["hinted_correct"] / stats["hinted"]
      )
    metrics["adv_abs"] = float(np.abs(batch["adv"]).mean())
    return batch, metrics

  return fn
