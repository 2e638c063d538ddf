"""Tree rollouts: fork sampled chains at chosen tokens, reusing their cache.

  tr = tree.generate(params, prompts, rng, step, model_cfg=model_cfg,
                     tokenizer=tok, max_new_tokens=64, roots=4, forks=2,
                     fork_at="entropy")
  adv = tree.tree_advantages(rewards, tr.parent, tr.fork_col, tr.mask_full,
                             tr.prompt_ids)

Level 0 samples `roots` chains per prompt (segments.decode, which also
records each token's policy entropy). Each chain then forks `forks` times,
at its highest-entropy tokens (TreeRL's EPTree, ETTRL's entropy fork) or at
fixed depths: a branch forked at column t keeps tokens [0, t) of its parent
and resamples from token t on. The branch's KV cache is its parent's row
(gathered, nothing recomputed) with the slots from token t - 1 on hidden
(position -1); token t - 1 is fed again at the end of the buffer and the
branch decodes from there. Holes are never attended and positions are
explicit, so a branch's log-probs equal a fresh forward over its tokens
(tested).

Rows: N = B * roots * (1 + forks), roots first (prompt-major), then the
branches (prompt-major, `forks` per root). `mask` trains every token once:
a branch's shared prefix is masked (its owner is the parent row);
`mask_full` covers the whole completion (for rewards and lengths).
"""

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import rollout as rollout_lib
from rlreason import sampling as sampling_lib
from rlreason import segments
from rlreason.model import transformer


class TreeRollout(NamedTuple):
  """types.Rollout fields plus the tree (host numpy unless noted).

  Attributes beyond types.Rollout:
    parent: [N] row of the parent chain, -1 for roots.
    fork_col: [N] first column the row samples itself (0 for roots).
    mask_full: [N, T] the whole completion, shared prefix included.
    entropy: [N, T] policy entropy at each sampled token (0 elsewhere).
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


def fork_columns(
  entropy: np.ndarray,
  lengths: np.ndarray,
  forks: int,
  *,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
) -> np.ndarray:
  """[N, forks] columns t in [0, len - 1] to fork each chain at.

  "entropy": the `forks` highest-entropy tokens among columns 0 .. len - 1
  (ties: the earlier column); "depth": `depths` clipped to the chain. A
  chain too short to offer distinct columns repeats its last choice.
  """
  n, _ = entropy.shape
  out = np.zeros((n, forks), np.int32)
  for i in range(n):
    # Columns 0 .. hi - 1: a branch never keeps the stop token, and a
    # fork at 0 resamples from the prompt.
    hi = max(int(lengths[i]), 1)
    if fork_at == "entropy":
      cols = np.arange(hi)
      order = cols[np.argsort(-entropy[i, :hi], kind="stable")]
      pick = list(order[:forks])
    elif fork_at == "depth":
      pick = [min(max(int(d), 0), hi - 1) for d in depths[:forks]] or [0]
    else:
      raise ValueError(f"fork_at={fork_at!r}: expected 'entropy' or 'depth'")
    pick += [pick[-1]] * (forks - len(pick))
    out[i] = sorted(pick)
  return out


def _fork_cache(cache, rows, hide_from):
  """Cache rows `rows`, slots >= hide_from[r] hidden (position -1)."""
  take = lambda x: jnp.take(x, rows, axis=0)
  slots = jnp.arange(cache.pos.shape[1])[None, :]
  pos = jnp.where(slots >= hide_from[:, None], -1, take(cache.pos))
  return transformer.Cache(
    k=tuple(take(k) for k in cache.k),
    v=tuple(take(v) for v in cache.v),
    pos=pos,
    index=cache.index,
  )


_fork_cache_jit = jax.jit(_fork_cache)


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
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
  sampling: sampling_lib.Sampling | None = None,
  max_prompt_len: int | None = None,
  bucket: int = 32,
  mesh: jax.sharding.Mesh | None = None,
) -> TreeRollout:
  """Samples `roots` chains per prompt, then `forks` branches per chain.

  Args:
    params, prompts, rng, step, model_cfg, tokenizer: as rollout.generate.
    max_new_tokens: T, the completion budget of every row (branches too).
    roots: chains sampled from the prompt (per prompt).
    forks: branches per chain.
    fork_at: "entropy" or "depth" (then `depths`), see fork_columns.
    sampling: temperature / filters.
    max_prompt_len, bucket: as rollout.pad_prompts.
    mesh: decode with the parameters in the rollout layout
      (mesh.ROLLOUT_RULES) on this mesh; None: where they are.

  Returns:
    A TreeRollout with N = B * roots * (1 + forks) rows.
  """
  sampling = sampling or sampling_lib.Sampling()
  if mesh is not None:
    params = jax.device_put(
      params, rollout_lib.rollout_shardings(mesh, model_cfg)
    )
  t = int(max_new_tokens)
  tokens, positions = rollout_lib.pad_prompts(
    prompts, tokenizer.pad_id, max_len=max_prompt_len, bucket=bucket
  )
  b, p = tokens.shape
  tokens = np.repeat(tokens, roots, axis=0)
  positions = np.repeat(positions, roots, axis=0)
  n0 = b * roots
  stops = (int(tokenizer.eos_id),)
  kw = dict(
    model_cfg=model_cfg,
    sampling=sampling,
    stop_ids=stops,
    pad_id=tokenizer.pad_id,
  )
  rng = jax.random.fold_in(rng, step)
  cache = transformer.init_cache(model_cfg, n0, p + 2 * t)
  logits, cache = segments.extend(
    params, cache, tokens, positions, model_cfg=model_cfg
  )
  start = positions[:, -1] + 1
  seg, cache = segments.decode(
    params,
    cache,
    logits,
    jnp.asarray(start),
    jnp.ones(n0, bool),
    jax.random.fold_in(rng, 0),
    max_new_tokens=t,
    **kw,
  )
  root = jax.device_get(seg)
  cols = fork_columns(
    root.entropy * (np.arange(t)[None] < root.lengths[:, None]),
    root.lengths,
    forks,
    fork_at=fork_at,
    depths=depths,
  )  # [n0, F]
  parent = np.repeat(np.arange(n0), forks)
  fork = cols.reshape(-1)
  # Token t-1 of the parent sits in slot p + t - 1: hide it and after.
  bcache = _fork_cache_jit(
    cache, jnp.asarray(parent), jnp.asarray(p + fork - 1)
  )
  # Token t - 1 (the last prompt token for t = 0) is fed again.
  prev_tok = np.where(
    fork > 0, root.tokens[parent, np.maximum(fork - 1, 0)], tokens[parent, -1]
  )[:, None]
  prev_pos = (start[parent] + fork - 1)[:, None].astype(np.int32)
  logits, bcache = segments.extend(
    params, bcache, prev_tok, prev_pos, model_cfg=model_cfg
  )
  br, _ = segments.decode(
    params,
    bcache,
    logits,
    jnp.asarray(start[parent] + fork),
    jnp.ones(len(parent), bool),
    jax.random.fold_in(rng, 1),
    max_new_tokens=t,
    **kw,
  )
  br = jax.device_get(br)
  return _assemble(
    tokens, positions, root, br, parent, fork, t, tokenizer, roots, forks
  )


def _assemble(tokens, positions, root, br, parent, fork, t, tok, roots, forks):
  n0, nb = root.tokens.shape[0], len(parent)
  n = n0 + nb
  comp = np.full((n, t), tok.pad_id, np.int32)
  logp = np.zeros((n, t), np.float32)
  plogp, ent = np.zeros_like(logp), np.zeros_like(logp)
  lengths = np.zeros(n, np.int32)
  stopped = np.zeros(n, bool)
  comp[:n0], logp[:n0] = root.tokens, root.logp
  plogp[:n0], ent[:n0] = root.policy_logp, root.entropy
  lengths[:n0], stopped[:n0] = root.lengths, root.stopped
  for j in range(nb):
    i, f = n0 + j, int(fork[j])
    own = min(int(br.lengths[j]), t - f)
    comp[i, :f] = root.tokens[parent[j], :f]
    logp[i, :f] = root.logp[parent[j], :f]
    plogp[i, :f] = root.policy_logp[parent[j], :f]
    comp[i, f : f + own] = br.tokens[j, :own]
    logp[i, f : f + own] = br.logp[j, :own]
    plogp[i, f : f + own] = br.policy_logp[j, :own]
    ent[i, f : f + own] = br.entropy[j, :own]
    lengths[i] = f + own
    stopped[i] = bool(br.stopped[j]) and own == br.lengths[j]
  cols = np.arange(t)[None]
  mask_full = (cols < lengths[:, None]).astype(np.int32)
  fork_col = np.concatenate([np.zeros(n0, np.int32), fork.astype(np.int32)])
  mask = mask_full * (cols >= fork_col[:, None])
  comp = np.where(mask_full > 0, comp, tok.pad_id)
  logp, plogp = logp * mask_full, plogp * mask_full
  all_tokens = np.concatenate([tokens, tokens[parent]], axis=0)
  all_pos = np.concatenate([positions, positions[parent]], axis=0)
  start = all_pos[:, -1:] + 1
  comp_pos = np.where(mask_full > 0, start + cols, -1).astype(np.int32)
  b = n0 // roots
  prompt_ids = np.concatenate(
    [np.repeat(np.arange(b), roots), np.repeat(np.arange(b), roots * forks)]
  )
  return TreeRollout(
    tokens=jnp.asarray(np.concatenate([all_tokens, comp], axis=1)),
    positions=jnp.asarray(np.concatenate([all_pos, comp_pos], axis=1)),
    prompt_len=tokens.shape[1],
    logp=jnp.asarray(logp),
    policy_logp=jnp.asarray(plogp),
    mask=jnp.asarray(mask),
    lengths=lengths,
    finish_reasons=np.where(stopped, "eos", "length"),
    texts=[tok.decode(comp[i, : lengths[i]].tolist()) for i in range(n)],
    prompt_ids=prompt_ids,
    parent=np.concatenate([np.full(n0, -1), parent]).astype(np.int32),
    fork_col=fork_col,
    mask_full=mask_full,
    entropy=ent,
  )


def prompt_major(tr: TreeRollout) -> TreeRollout:
  """Rows reordered so each prompt's tree is contiguous (roots, branches),
  as the loop's group statistics expect; `parent` is remapped."""
  order = np.argsort(tr.prompt_ids, kind="stable")
  new = np.empty_like(order)
  new[order] = np.arange(len(order))
  take = lambda x: x[order] if isinstance(x, np.ndarray) else x
  fields = {k: take(v) for k, v in tr._asdict().items()}
  for k in ("tokens", "positions", "logp", "policy_logp", "mask"):
    fields[k] = jnp.asarray(np.asarray(getattr(tr, k))[order])
  fields["texts"] = [tr.texts[i] for i in order]
  fields["parent"] = np.where(tr.parent[order] >= 0, new[tr.parent[order]], -1)
  return TreeRollout(**fields)


def tree_advantages(
  rewards: np.ndarray,
  parent: np.ndarray,
  fork_col: np.ndarray,
  mask: np.ndarray,
  prompt_ids: np.ndarray,
  *,
  scale_by_leaves: bool = True,
) -> np.ndarray:
  """TreeRL's process advantages from subtree outcomes, per token.

  TreeRL (Hou et al. 2025, arXiv:2506.11902, Sec. 3.2): a node s (a span
  of tokens between forks) has value V(s) = mean outcome reward of the
  leaves below it, and every token of s gets

    A(s) = [(V(s) - V(root)) + (V(s) - V(parent(s)))] / sqrt(|L(s)|)

  (global + local advantage; the 1/sqrt(|L(s)|) keeps shared prefixes,
  which many leaves vote on, from dominating). V(root) is the prompt's
  mean reward over its whole tree.

  Args:
    rewards: [N] outcome reward of each row (leaf).
    parent: [N] parent row, -1 for roots (TreeRollout.parent).
    fork_col: [N] first own column of each row.
    mask: [N, T] owned tokens (TreeRollout.mask).
    prompt_ids: [N] prompt of each row.
    scale_by_leaves: divide by sqrt(|L(s)|) (TreeRL); False: not.

  Returns:
    [N, T] float32 advantages, 0 where mask = 0.
  """
  rewards = np.asarray(rewards, np.float64)
  n, t = mask.shape
  children = [[] for _ in range(n)]
  for r in range(n):
    if parent[r] >= 0:
      children[parent[r]].append(r)
  memo = {}

  def below(r):  # all rows in r's subtree (r included)
    if r not in memo:
      memo[r] = [r] + [x for q in children[r] for x in below(q)]
    return memo[r]

  def leaves(r, end):  # leaves sharing row r's tokens [.., end)
    return [r] + [
      x for q in children[r] if fork_col[q] >= end for x in below(q)
    ]

  root_v = {p: rewards[prompt_ids == p].mean() for p in set(prompt_ids)}
  adv = np.zeros((n, t), np.float32)
  for r in range(n):
    cuts = sorted({int(fork_col[r])} | {int(fork_col[q]) for q in children[r]})
    cuts = [c for c in cuts if c < t] + [t]
    prev_v = None
    if parent[r] >= 0 and fork_col[r] > 0:  # a fork at 0 hangs off the root
      prev_v = rewards[leaves(parent[r], fork_col[r])].mean()
    for a, b in zip(cuts[:-1], cuts[1:]):
      lv = leaves(r, b)
      v = rewards[lv].mean()
      vr = root_v[prompt_ids[r]]
      vp = vr if prev_v is None else prev_v
      a_s = (v - vr) + (v - vp)
      if scale_by_leaves:
        a_s /= np.sqrt(len(lv))
      adv[r, a:b] = a_s
      prev_v = v
  return adv * (np.asarray(mask) > 0)


def make_generate_fn(
  cfg,
  *,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
  whole_leaves: bool = False,
):
  """A loop generate_fn (train(generate_fn=...)) sampling trees per prompt.

  Training rollouts (group_size divisible by 1 + cfg.forks) are trees of
  group_size / (1 + cfg.forks) chains, each forked cfg.forks times, returned
  prompt-major; any other group size (evaluation) samples plain chains.
  whole_leaves: every leaf's mask covers its whole response, shared prefix
  included (ETTRL); otherwise each token is owned by one leaf (TreeRL).
  """

  def fn(ctx, params, examples, rng, step, *, group_size, sampling):
    prompts = ctx.encode_prompts(examples)
    kw = dict(
      model_cfg=ctx.model_cfg,
      tokenizer=ctx.tokenizer,
      max_new_tokens=cfg.max_new_tokens,
      sampling=sampling,
      max_prompt_len=cfg.max_prompt_len,
      mesh=ctx.mesh,
    )
    if group_size % (1 + cfg.forks):  # evaluation: plain chains
      return rollout_lib.generate(
        params, prompts, rng, step, group_size=group_size, **kw
      )
    tr = generate(
      params,
      prompts,
      rng,
      step,
      roots=group_size // (1 + cfg.forks),
      forks=cfg.forks,
      fork_at=fork_at,
      depths=depths,
      **kw,
    )
    out = prompt_major(tr)
    if whole_leaves:
      out = out._replace(mask=jnp.asarray(tr.mask_full))
    return out

  return fn
