"""Tree rollouts: fork sampled chains at chosen tokens, reusing their cache.

  tr = tree.generate(params, prompts, rng, step, model_cfg=model_cfg,
                     tokenizer=tok, max_new_tokens=64, roots=4, forks=2,
                     levels=1, branches=1, fork_at="entropy")

Credit assignment on a finished tree's rewards (TreeRL's subtree-value
process advantages) is tree_credit.py; training on trees (a loop
generate_fn, prompt-major rows) is tree_loop.py; where a tree forks is
tree_forks.py.

TreeRL's EPTree(M, N, L, T) (Hou et al. 2025, arXiv:2506.11902;
the authors' entropy_chain_local_manager.py): level 0 samples M = `roots`
chains per prompt (segments.decode, which also records each token's
policy entropy); each is the root of its own tree. Then L = `levels`
expansion rounds: in each, every tree picks its N = `forks` highest-entropy
tokens pooled over ALL the chains it holds so far (the root and the
branches of earlier rounds, not only the newest ones), and from each such
fork point T = `branches` new chains are sampled. A tree ends with
1 + L * N * T leaves, a prompt with M * (1 + L * N * T). A token already
used as a fork point, and a branch's first token (forking there repeats
its own fork), are not candidates again (the released code re-allows
used points for L > 1; we do not). Tokens rank by the entropy of the
policy at them (the released code ranks by the sampled token's surprisal
-log p). experiments/ettrl.py uses the same construction for ETTRL's
entropy-fork tree (arXiv:2508.11356). With L = 1 a tree is one chain, so
its N fork points are that chain's N highest-entropy tokens.

fork_at="depth" forks at fixed depths instead: in round 1 the root at
columns `depths` (clipped to the chain); in round l > 1 the chains made in
round l - 1 at `depths` columns after their own fork column (a fixed-
spacing tree), the first N distinct candidates per tree.

A branch forked at column t keeps tokens [0, t) of its parent and
resamples from token t on. Its KV cache is its parent's row (gathered,
nothing recomputed) with every slot at position >= pos(t - 1) hidden
(position -1); token t - 1 (the last prompt token for t = 0) is fed again
at the end of the buffer and the branch decodes from there. Holes are never
attended and positions are explicit, so a branch's log-probs equal a fresh
forward over its tokens at any depth (tested). The cache holds
P + (1 + L) * T slots: every round appends at most T.

Rows: roots first (prompt-major), then round 1's branches, round 2's, ...;
within a round tree-major (prompt-major), fork points in (row, column)
order, `branches` rows per point. `mask` trains every token once: a
branch's shared prefix is masked (its owner is the ancestor that sampled
it); `mask_full` covers the whole completion (for rewards and lengths).

Stop sequences end a row as in segments.decode; a branch's shared prefix
counts (one spanning the fork is found on the host, and the branch is cut
there). With a mesh, every round's rows, the caches and the outputs are
split over the rollout batch axes, as in multiturn.py.
"""

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.sampling import padding
from rlreason.sampling import rollout_layout
from rlreason.sampling import draw
from rlreason.sampling import engine
from rlreason.sampling import segments
from rlreason.sampling import tree_forks
from rlreason.sampling import stops
from rlreason.model import transformer


class TreeRollout(NamedTuple):
  """types.Rollout fields plus the tree (host numpy unless noted).

  Attributes beyond types.Rollout:
    parent: [N] row of the parent chain, -1 for roots.
    fork_col: [N] first column the row samples itself (0 for roots).
    mask_full: [N, T] the whole completion, shared prefix included.
    entropy: [N, T] policy entropy at each sampled token (0 elsewhere).
    level: [N] expansion round that sampled the row (0 for roots).
  """

  tokens: jax.Array
  positions: jax.Array
  prompt_len: int
  logp: jax.Array
  policy_logp: jax.Array
  mask: jax.Array
  lengths: np.ndarray
  finish_reasons: np.ndarray
  texts: list[str]
  prompt_ids: np.ndarray
  parent: np.ndarray
  fork_col: np.ndarray
  mask_full: np.ndarray
  entropy: np.ndarray
  level: np.ndarray


def leaves_per_tree(forks: int, levels: int = 1, branches: int = 1) -> int:
  """1 + L * N * T: the chains one root grows into."""
  return 1 + levels * forks * branches


@functools.partial(jax.jit, static_argnames=("mesh",))
def _fork_cache(cache, rows, hide_from, *, mesh=None):
  """Cache rows `rows`, slots at position >= hide_from[r] hidden (-1)."""
  take = lambda x: jnp.take(x, rows, axis=0)
  pos = take(cache.pos)
  pos = jnp.where(pos >= hide_from[:, None], -1, pos)
  out = transformer.Cache(
    k=tuple(take(k) for k in cache.k),
    v=tuple(take(v) for v in cache.v),
    pos=pos,
    index=cache.index,
  )
  return engine.constrain_cache(out, mesh)


@functools.partial(jax.jit, static_argnames=("mesh",))
def _concat_caches(caches, *, mesh=None):
  """One cache of all rows; writes continue after the furthest index (the
  slots a shorter row skips hold position -1: holes)."""
  cat = lambda xs: jnp.concatenate(xs, axis=0)
  out = transformer.Cache(
    k=tuple(cat(ks) for ks in zip(*(c.k for c in caches))),
    v=tuple(cat(vs) for vs in zip(*(c.v for c in caches))),
    pos=cat([c.pos for c in caches]),
    index=jnp.max(jnp.stack([c.index for c in caches])),
  )
  return engine.constrain_cache(out, mesh)


class _Rows:
  """The host-side rows of a growing tree batch."""

  def __init__(self, seg, t):
    n = len(seg.lengths)
    self.comp = np.asarray(seg.tokens, np.int32)
    self.logp = np.asarray(seg.logp, np.float32)
    self.plogp = np.asarray(seg.policy_logp, np.float32)
    own = np.arange(t)[None] < np.asarray(seg.lengths)[:, None]
    self.ent = np.asarray(seg.entropy, np.float32) * own
    self.lengths = np.asarray(seg.lengths, np.int32)
    self.stopped = np.asarray(seg.stopped, bool)
    self.parent = np.full(n, -1, np.int32)
    self.fork_col = np.zeros(n, np.int32)
    self.tree_of = np.arange(n)
    self.level = np.zeros(n, np.int32)
    self.used = np.zeros((n, t), bool)

  def add(self, seg, parent, fork, level, pad_id, stop_sequences=()):
    """Appends the branches `seg` sampled from (parent, fork); a branch
    whose shared prefix ends inside a stop sequence that its own tokens
    complete (the device check sees only its own tokens) stops there."""
    nb, t = len(parent), self.comp.shape[1]
    comp = np.full((nb, t), pad_id, np.int32)
    logp = np.zeros((nb, t), np.float32)
    plogp, ent = np.zeros_like(logp), np.zeros_like(logp)
    lengths = np.zeros(nb, np.int32)
    stopped = np.zeros(nb, bool)
    for j in range(nb):
      i, f = int(parent[j]), int(fork[j])
      own = min(int(seg.lengths[j]), t - f)
      comp[j, :f], logp[j, :f] = self.comp[i, :f], self.logp[i, :f]
      plogp[j, :f] = self.plogp[i, :f]
      comp[j, f : f + own] = seg.tokens[j, :own]
      logp[j, f : f + own] = seg.logp[j, :own]
      plogp[j, f : f + own] = seg.policy_logp[j, :own]
      ent[j, f : f + own] = seg.entropy[j, :own]
      lengths[j] = f + own
      stopped[j] = bool(seg.stopped[j]) and own == seg.lengths[j]
      end = _first_stop_across(comp[j], f, f + own, stop_sequences)
      if end is not None:
        lengths[j], stopped[j] = end, True
        comp[j, end:], logp[j, end:] = pad_id, 0.0
        plogp[j, end:], ent[j, end:] = 0.0, 0.0
    self.used[parent, fork] = True
    cat = lambda a, b: np.concatenate([a, b], axis=0)
    self.comp, self.logp = cat(self.comp, comp), cat(self.logp, logp)
    self.plogp, self.ent = cat(self.plogp, plogp), cat(self.ent, ent)
    self.lengths, self.stopped = (
      cat(self.lengths, lengths),
      cat(self.stopped, stopped),
    )
    self.parent = cat(self.parent, np.asarray(parent, np.int32))
    self.fork_col = cat(self.fork_col, np.asarray(fork, np.int32))
    self.tree_of = cat(self.tree_of, self.tree_of[parent])
    self.level = cat(self.level, np.full(nb, level, np.int32))
    self.used = cat(self.used, np.zeros((nb, t), bool))


def _first_stop_across(comp, fork, end, stop_sequences):
  """The length up to the first stop sequence in comp[:end] that starts
  before `fork` and ends at or after it; None if there is none."""
  k_max = max(map(len, stop_sequences), default=1)
  for e in range(fork, min(end, fork + k_max - 1)):
    for seq in stop_sequences:
      a = e - len(seq) + 1
      if 0 <= a < fork and tuple(comp[a : e + 1]) == seq:
        return e + 1
  return None


def generate(
  params: Any,
  prompts: Sequence[Sequence[int]],
  rng: jax.Array,
  step: int,
  *,
  model_cfg,
  tokenizer,
  max_new_tokens: int,
  roots: int,
  forks: int,
  levels: int = 1,
  branches: int = 1,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
  sampling: draw.Sampling | None = None,
  max_prompt_len: int | None = None,
  bucket: int = 32,
  mesh: jax.sharding.Mesh | None = None,
  stop_sequences: Sequence[Sequence[int]] = (),
  row_offsets: Sequence[int] = (),
) -> TreeRollout:
  """EPTree(roots, forks, levels, branches) per prompt (module docstring).

  Args:
    params, prompts, rng, step, model_cfg, tokenizer: as rollout.generate.
    max_new_tokens: T, the completion budget of every row (branches too).
    roots: M, chains sampled from the prompt (per prompt).
    forks: N, fork points per tree and round.
    levels: L >= 1, expansion rounds.
    branches: T, chains sampled from each fork point.
    fork_at: "entropy" or "depth" (then `depths`).
    sampling: temperature / filters.
    max_prompt_len, bucket: as padding.pad_prompts.
    mesh: decode on this mesh: parameters in the rollout layout
      (mesh.ROLLOUT_RULES; regrouped to model_cfg.rollout_tensor,
      rollout_layout.sampling_mesh, the outputs back on `mesh`), rows
      (the cache, every round's inputs, the outputs) split over its batch
      axes (replicated when a round's row count does not divide); None:
      where the parameters are, unsplit.
    stop_sequences: token-id sequences that end a row (besides EOS) once
      its completion ends with one; a branch's shared prefix counts.
    row_offsets: per round (0 = the roots, then levels 1..L), the index
      its first row would have in that round of one call over a larger
      batch (default 0s): rows draw with their key there, so a batch's
      prompts sampled in several calls draw as in one (tree_loop).

  Returns:
    A TreeRollout with N = B * roots * leaves_per_tree(...) rows.
  """
  if levels < 1 or forks < 1 or branches < 1 or roots < 1:
    raise ValueError(
      f"tree.generate: roots={roots}, forks={forks}, levels={levels}, "
      f"branches={branches} must all be >= 1"
    )
  sampling = sampling or draw.Sampling()
  stop_ids, stop_seqs = stops.split((tokenizer.eos_id,), stop_sequences)
  stops.check_vocab(stop_ids, stop_seqs, model_cfg.vocab_size)
  out_on = functools.partial(mesh_lib.put_rows, mesh)  # the outputs'
  mesh = rollout_layout.sampling_mesh(mesh, model_cfg)  # --rollout_tensor
  rows_on = functools.partial(mesh_lib.put_rows, mesh)
  params, rng = rollout_layout.on_mesh(
    params, jax.random.fold_in(rng, step), mesh, model_cfg
  )
  t = int(max_new_tokens)
  tokens, positions = padding.pad_prompts(
    prompts, tokenizer.pad_id, max_len=max_prompt_len, bucket=bucket
  )
  b, p = tokens.shape
  tokens = np.repeat(tokens, roots, axis=0)
  positions = np.repeat(positions, roots, axis=0)
  n0 = b * roots
  kw = dict(
    model_cfg=model_cfg,
    sampling=sampling,
    stop_ids=stop_ids,
    stop_sequences=stop_seqs,
    pad_id=tokenizer.pad_id,
    max_new_tokens=t,
    mesh=mesh,
  )
  offsets = tuple(row_offsets) or (0,) * (1 + levels)
  if len(offsets) != 1 + levels:
    raise ValueError(
      f"tree.generate: {len(offsets)} row_offsets for {1 + levels} rounds"
    )
  cache = segments.init_cache(model_cfg, n0, p + (1 + levels) * t, mesh=mesh)
  logits, cache = segments.extend(
    params, cache, *rows_on((tokens, positions)), model_cfg=model_cfg, mesh=mesh
  )
  start = positions[:, -1] + 1  # [n0] position of completion token 0
  seg, cache = segments.decode(
    params,
    cache,
    logits,
    *rows_on((start.astype(np.int32), np.ones(n0, bool))),
    jax.random.fold_in(rng, 0),
    offsets[0],
    **kw,
  )
  rows = _Rows(mesh_lib.to_host(seg), t)
  caches = [cache]
  for level in range(1, levels + 1):
    if level == 1:
      cols = tree_forks.fork_columns(
        rows.ent, rows.lengths, forks, fork_at=fork_at, depths=depths
      )  # [n0, N]
      parent, fork = np.repeat(np.arange(n0), forks), cols.reshape(-1)
    else:
      parent, fork = tree_forks.pooled_fork_points(
        rows.ent,
        rows.lengths,
        rows.parent,
        rows.fork_col,
        rows.tree_of,
        rows.level,
        rows.used,
        forks,
        round_=level,
        fork_at=fork_at,
        depths=depths,
      )
    parent, fork = np.repeat(parent, branches), np.repeat(fork, branches)
    root = rows.tree_of[parent]
    src = caches[0]
    if len(caches) > 1:
      src = _concat_caches(tuple(caches), mesh=mesh)
    # Hide the parent's token fork - 1 (position start + fork - 1) and
    # every later one, wherever in its buffer it sits.
    prev_pos = (start[root] + fork - 1).astype(np.int32)
    bcache = _fork_cache(
      src, *rows_on((parent.astype(np.int32), prev_pos)), mesh=mesh
    )
    # Token fork - 1 (the last prompt token for fork = 0) is fed again.
    prev_tok = np.where(
      fork > 0,
      rows.comp[parent, np.maximum(fork - 1, 0)],
      tokens[root, -1],
    )[:, None]
    logits, bcache = segments.extend(
      params,
      bcache,
      *rows_on((prev_tok.astype(np.int32), prev_pos[:, None])),
      model_cfg=model_cfg,
      mesh=mesh,
    )
    seg, bcache = segments.decode(
      params,
      bcache,
      logits,
      *rows_on(
        ((start[root] + fork).astype(np.int32), np.ones(len(parent), bool))
      ),
      jax.random.fold_in(rng, level),
      offsets[level],
      **kw,
    )
    rows.add(
      mesh_lib.to_host(seg), parent, fork, level, tokenizer.pad_id, stop_seqs
    )
    if level < levels:
      caches.append(bcache)
  return _assemble(tokens, positions, rows, tokenizer, roots, out_on)


def _assemble(tokens, positions, rows, tok, roots, rows_on):
  n, t = rows.comp.shape
  cols = np.arange(t)[None]
  mask_full = (cols < rows.lengths[:, None]).astype(np.int32)
  mask = mask_full * (cols >= rows.fork_col[:, None])
  comp = np.where(mask_full > 0, rows.comp, tok.pad_id)
  logp, plogp = rows.logp * mask_full, rows.plogp * mask_full
  all_tokens, all_pos = tokens[rows.tree_of], positions[rows.tree_of]
  start = all_pos[:, -1:] + 1
  comp_pos = np.where(mask_full > 0, start + cols, -1).astype(np.int32)
  full_tokens, full_pos, logp, plogp, mask = rows_on(
    (
      np.concatenate([all_tokens, comp], axis=1),
      np.concatenate([all_pos, comp_pos], axis=1),
      logp,
      plogp,
      mask,
    )
  )
  return TreeRollout(
    tokens=full_tokens,
    positions=full_pos,
    prompt_len=tokens.shape[1],
    logp=logp,
    policy_logp=plogp,
    mask=mask,
    lengths=rows.lengths,
    finish_reasons=np.where(rows.stopped, "eos", "length"),
    texts=[tok.decode(comp[i, : rows.lengths[i]].tolist()) for i in range(n)],
    prompt_ids=(rows.tree_of // roots).astype(np.int64),
    parent=rows.parent,
    fork_col=rows.fork_col,
    mask_full=mask_full,
    entropy=rows.ent,
    level=rows.level,
  )
