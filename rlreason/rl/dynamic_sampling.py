"""Dynamic sampling: keep only informative groups, refill the batch.

DAPO (Yu et al. 2025, arXiv:2503.14476, Sec. 3.2, Eq. 11): a group whose G
completions are all correct (or all wrong) has zero advantage under any
group baseline and adds no gradient, only noise to the normaliser. DAPO
over-samples: such groups are dropped and more prompts are sampled until
the batch holds B groups with 0 < accuracy < 1.

  make_batch = dynamic_sampling.refill(objective.make_batch, max_rounds=3)

`refill` wraps any make_batch. Round 0 is the loop's rollout; each further
round draws the next B prompts from the run's prompt iterator and samples
them with the current policy through `ctx.sample_more(round)` (loop.py), so
the iterator position saved with each checkpoint covers every prompt drawn
and a resumed run continues exactly. If `max_rounds` rounds do not fill B
groups (verl's `max_num_gen_batches`; verl raises, OpenRLHF trains on what
it has), the batch is completed with filtered groups whose mask is zeroed:
they weigh nothing in any loss or normaliser, and the shapes stay [N, ...].

The decision uses the 0/1 verifier (`ctx.correct_fn`), as the paper and
verl's `filter_groups.metric=acc`, so shaped rewards (overlong penalty) do
not make a group informative. Another rule may decide instead (`keep`):
RLPR refills the groups its std filter dropped (`kept_groups`), and puts
the prompts of kept groups past the batch back to be sampled again
(`put_back`, as its authors' filter_cache_regenerate). Advantages
must be group-local (every outcome estimator is; batch-whitened
REINFORCE++ is not): they are computed per round, before groups are
selected.
"""

from typing import Callable

import numpy as np


def informative_groups(correct: np.ndarray, group_size: int) -> np.ndarray:
  """[B] bool: groups whose correctness is not all equal.

  Args:
    correct: [N] 0/1 correctness, N = B * G, groups contiguous.
    group_size: G.
  """
  grouped = np.asarray(correct, np.float32).reshape(-1, group_size)
  return grouped.min(-1) != grouped.max(-1)


def select_groups(batch: dict, groups: np.ndarray, group_size: int) -> dict:
  """The rows of `groups` (indices into B) of a [N, ...] batch, in order."""
  rows = (
    np.asarray(groups, np.int64)[:, None] * group_size
    + np.arange(group_size)[None, :]
  ).reshape(-1)
  return {k: np.asarray(v)[rows] for k, v in batch.items()}


def concat(batches: list[dict], pad_id: int) -> dict:
  """Concatenates [N_i, ...] batches along rows.

  Prompts are left padded to a per-rollout length P, so "tokens" and
  "positions" [N, P + T] may differ in width; narrower ones are left padded
  with `pad_id` and position -1 (never attended). Other fields must agree.
  """
  width = max(b["tokens"].shape[1] for b in batches)
  out = {}
  for k in batches[0]:
    parts = []
    for b in batches:
      v = np.asarray(b[k])
      if k in ("tokens", "positions") and v.shape[1] < width:
        fill = pad_id if k == "tokens" else -1
        pad = np.full((v.shape[0], width - v.shape[1]), fill, v.dtype)
        v = np.concatenate([pad, v], axis=1)
      parts.append(v)
    out[k] = np.concatenate(parts, axis=0)
  return out


def _mean_metrics(rows: list[dict]) -> dict:
  """Per-key mean over rounds (keys missing in a round are skipped)."""
  keys = dict.fromkeys(k for r in rows for k in r)
  return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


def kept_groups(rollout, examples, batch, ctx) -> np.ndarray:
  """[B] bool: the groups `batch` still trains on (some mask left): a
  `refill` rule for a make_batch that drops groups itself
  (objective.drop_groups)."""
  del rollout, examples
  mask = np.asarray(batch["mask"])
  return mask.reshape(len(mask) // ctx.cfg.group_size, -1).any(1)


def _informative(rollout, examples, batch, ctx) -> np.ndarray:
  del batch
  gold = [examples[i].answer for i in rollout.prompt_ids]
  return informative_groups(
    ctx.correct_fn(rollout.texts, gold), ctx.cfg.group_size
  )


def refill(
  make_batch: Callable,
  *,
  max_rounds: int,
  keep: Callable | None = None,
  put_back: Callable | None = None,
) -> Callable:
  """Wraps `make_batch` with DAPO's group filter and refill.

  Args:
    make_batch: (rollout, examples, ctx) -> (batch, metrics) with
      group-local advantages.
    max_rounds: at most this many rollouts per step (round 0 included).
    keep: (rollout, examples, batch, ctx) -> [B] bool, the groups a round
      contributes; default DAPO's (`informative_groups` on the verifier).
    put_back: called with the examples of the kept groups past the B the
      batch takes (the last round's), so that they are sampled again
      later (iterator.PutBack.put_back: RLPR's authors' regeneration);
      None drops them, as DAPO's.

  Returns:
    A make_batch whose batch holds the loop's B groups: informative ones,
    then (if rounds ran out) mask-zeroed filtered ones. Its metrics are the
    per-round means of `make_batch`'s (the policy's accuracy on all sampled
    prompts, not on the filtered batch) plus dynamic/rounds,
    dynamic/informative (fraction of sampled groups kept as informative)
    and dynamic/filled (fraction of the B groups that are informative);
    with `put_back`, dynamic/put_back (groups put back, over B).
  """
  if max_rounds < 1:
    raise ValueError(f"max_rounds={max_rounds} must be >= 1")
  keep = keep or _informative

  def wrapped(rollout, examples, ctx):
    g = ctx.cfg.group_size
    b = len(examples)
    kept, spare, rows = [], [], []
    n_kept = n_seen = n_informative = n_over = 0
    for r in range(max_rounds):
      if r:
        rollout, examples = ctx.sample_more(r)
      batch, metrics = make_batch(rollout, examples, ctx)
      ok = np.asarray(keep(rollout, examples, batch, ctx), bool)
      rows.append(metrics)
      n_seen += len(ok)
      n_informative += int(ok.sum())
      take, over = np.split(np.flatnonzero(ok), [b - n_kept])
      if put_back is not None and len(over):
        ids = np.asarray(rollout.prompt_ids)[over * g]
        put_back([examples[i] for i in ids])
        n_over = len(over)
      kept.append(select_groups(batch, take, g))
      spare.append(select_groups(batch, np.flatnonzero(~ok), g))
      n_kept += len(take)
      if n_kept == b:
        break
    if n_kept < b:  # Out of rounds: complete with weightless groups.
      pad = concat(spare, ctx.tokenizer.pad_id)
      pad = {k: v[: (b - n_kept) * g] for k, v in pad.items()}
      pad["mask"] = np.zeros_like(pad["mask"])
      if "adv" in pad:
        pad["adv"] = np.zeros_like(pad["adv"])
      kept.append(pad)
    metrics = _mean_metrics(rows)
    metrics.update(
      {
        "dynamic/rounds": float(len(rows)),
        "dynamic/informative": n_informative / max(n_seen, 1),
        "dynamic/filled": n_kept / b,
      }
    )
    if put_back is not None:
      metrics["dynamic/put_back"] = n_over / b
    return concat(kept, ctx.tokenizer.pad_id), metrics

  return wrapped
