"""Scores of a rollout under the policy itself, for self-rewarding methods.

Label-free and confidence rewards need more than the sampled tokens'
log-probs: RENT (arXiv:2505.22660) the per-token entropy of the answer
tokens (Context.completion_scores gives it) and which tokens are the
answer, RLPR (arXiv:2506.18254) the policy's probability of the *reference*
answer after its own reasoning. The functions here compute those on the
host side of make_batch, from `ctx.params` (the policy that sampled the
rollout); the reward math itself is in rewards/label_free.py.

Shapes: N sequences, P prompt length, T completion length, A scored
(reference) length.
"""

from typing import Callable, Sequence

import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason.sampling import padding
from rlreason.data import extract
from rlreason.rewards import likelihood


def answer_char_spans(
  texts: Sequence[str], extract_fn: Callable = extract.extract
) -> list[tuple[int, int] | None]:
  """Character span [start, end) of each text's final answer, or None.

  The answer is `extract_fn(text)` (default: last answer tag / boxed /
  `answer:` line); its span is the last occurrence of that string in the
  text (answers sit at the end of a completion).
  """
  spans = []
  for text in texts:
    answer = extract_fn(text)
    start = text.rfind(answer) if answer else -1
    spans.append(None if start < 0 else (start, start + len(answer)))
  return spans


def _first_token_reaching(ids, tokenizer, n_chars: int) -> int:
  """Smallest k with len(decode(ids[:k + 1])) > n_chars (binary search).

  Assumes decoded prefix lengths grow with k (true for the char tokenizer;
  byte-level BPE can differ by a character inside multi-byte text).
  """
  lo, hi = 0, len(ids) - 1
  while lo < hi:
    mid = (lo + hi) // 2
    if len(tokenizer.decode(ids[: mid + 1])) > n_chars:
      hi = mid
    else:
      lo = mid + 1
  return lo


def span_token_mask(
  completion_ids: np.ndarray,
  mask: np.ndarray,
  spans: Sequence[tuple[int, int] | None],
  tokenizer,
) -> np.ndarray:
  """[N, T] 1 on the completion tokens that cover each character span.

  Args:
    completion_ids: [N, T] completion token ids (rollout.tokens[:, P:]).
    mask: [N, T] completion mask.
    spans: N character spans [start, end) in the decoded completion, or
      None (that row gets an empty mask).
    tokenizer: the rollout's tokenizer (`decode` skips special tokens, as
      rollout.texts).
  """
  completion_ids = np.asarray(completion_ids)
  mask = np.asarray(mask)
  out = np.zeros(mask.shape, np.float32)
  for i, span in enumerate(spans):
    n = int(mask[i].sum())
    if span is None or n == 0:
      continue
    ids = completion_ids[i, :n].tolist()
    first = _first_token_reaching(ids, tokenizer, span[0])
    last = _first_token_reaching(ids, tokenizer, span[1] - 1)
    out[i, first : last + 1] = 1.0
  return out


def last_fraction_mask(mask: np.ndarray, fraction: float) -> np.ndarray:
  """[N, T] 1 on the last ceil(fraction * length) tokens of each completion.

  RENT's "last chunk" token selection (the project page: entropy near the
  end of the response correlates best with accuracy).
  """
  if not 0 < fraction <= 1:
    raise ValueError(f"fraction={fraction} not in (0, 1]")
  mask = np.asarray(mask, np.float32)
  lengths = mask.sum(-1, keepdims=True)
  keep = np.ceil(fraction * lengths)
  t = np.arange(mask.shape[1])[None]
  return ((t >= lengths - keep) & (mask > 0)).astype(np.float32)


def answer_token_mask(
  rollout,
  tokenizer,
  *,
  extract_fn: Callable = extract.extract,
  fallback_fraction: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """[N, T] mask of each completion's final-answer tokens (rollout.texts).

  Rows without an extractable answer get the last `fallback_fraction` of
  their tokens (`last_fraction_mask`), or nothing if it is None.

  Returns:
    (mask [N, T] float32, has_answer [N] bool).
  """
  tokens, mask = mesh_lib.to_host((rollout.tokens, rollout.mask))
  spans = answer_char_spans(rollout.texts, extract_fn)
  out = span_token_mask(tokens[:, rollout.prompt_len :], mask, spans, tokenizer)
  has_answer = np.array([s is not None for s in spans])
  if fallback_fraction is not None and not has_answer.all():
    fallback = last_fraction_mask(mask, fallback_fraction)
    out = np.where(has_answer[:, None], out, fallback)
  return out.astype(np.float32), has_answer


def reference_logprobs(
  params,
  model_cfg,
  tokenizer,
  prompts: Sequence[Sequence[int]],
  prefixes: Sequence[str],
  references: Sequence[str],
  *,
  temperature: float = 1.0,
  max_prompt_len: int | None = None,
  bucket: int = 16,
  rows: int = 0,
  mesh=None,
) -> tuple[np.ndarray, np.ndarray]:
  """Log-probs of reference answers after given prefixes, under the policy.

  Sequence i is prompts[i] + encode(prefixes[i]) + encode(references[i]):
  RLPR's "prompt + the policy's own reasoning + the reference answer". The
  prefix and the reference are encoded separately, so the scored tokens
  are exactly the reference's own tokenization.

  Args:
    params, model_cfg: the policy.
    tokenizer: the run's tokenizer.
    prompts: N prompt token-id lists.
    prefixes: N texts between the prompt and the reference (the reasoning
      and the answer opener, e.g. "...\\nanswer: "); may be empty.
    references: N reference answers (non-empty).
    temperature: score under softmax(logits / temperature).
    max_prompt_len: prompt budget (padding.pad_prompts).
    bucket: the completion width is rounded up to a multiple of this, so
      that batches of similar lengths share one compiled forward.
    rows: sequences per forward (0 = all at once).
    mesh: the run's; activations split by batch on it (as
      Context.completion_scores).

  Returns:
    (logp [N, A], mask [N, A]): per-token log-probs of the reference tokens,
    left-aligned, 0 beyond each reference's length.
  """
  n = len(prompts)
  if not n == len(prefixes) == len(references):
    raise ValueError(
      f"{n} prompts, {len(prefixes)} prefixes, {len(references)} references"
    )
  pre = [tokenizer.encode(p) for p in prefixes]
  ref = [tokenizer.encode(r) for r in references]
  if any(not r for r in ref):
    raise ValueError("every reference answer needs at least one token")
  completions = [p + r for p, r in zip(pre, ref, strict=True)]
  width = padding.bucket_length(max(map(len, completions)), bucket)
  batch = padding.pack(
    [list(p) for p in prompts],
    completions,
    tokenizer.pad_id,
    max_prompt_len,
    width,
  )
  prompt_len = batch["tokens"].shape[1] - width
  with mesh_lib.activation_mesh(mesh):
    logp = policy.completion_logprobs_by_rows(
      params,
      batch["tokens"],
      batch["positions"],
      model_cfg,
      prompt_len,
      rows=rows,
      temperature=temperature,
    )
  logp = mesh_lib.to_host(logp)
  a = max(map(len, ref))
  out = np.zeros((n, a), np.float32)
  mask = np.zeros((n, a), np.float32)
  for i in range(n):
    lo, k = len(pre[i]), len(ref[i])
    out[i, :k] = logp[i, lo : lo + k]
    mask[i, :k] = 1.0
  return out, mask


def reasoning_prefixes(
  texts: Sequence[str], opener: str, spans: Sequence | None = None
) -> list[str]:
  """Each completion's text before its final answer (RLPR's reasoning z):
  up to the answer's span (`spans`, default answer_char_spans(texts)); a
  completion without one keeps all its text, followed by `opener`."""
  spans = answer_char_spans(texts) if spans is None else spans
  return [
    t[: s[0]] if s is not None else t + opener
    for t, s in zip(texts, spans, strict=True)
  ]


def reference_probs(
  ctx, prompt_ids, prefixes, references, *, temperature=None
) -> np.ndarray:
  """[N] mean token probability of each reference answer after its prefix
  under the run's policy (ctx.params), on the run's mesh, one train
  micro-batch of rows per forward, under ctx.scoring (RLPR's reward, AMPO's
  comprehension); `temperature` None: the run's."""
  with ctx.scoring():  # --score_temp_budget_mib, as ctx.ref_logp
    logp, mask = reference_logprobs(
      ctx.params,
      ctx.model_cfg,
      ctx.tokenizer,
      prompt_ids,
      prefixes,
      references,
      temperature=ctx.cfg.temperature if temperature is None else temperature,
      max_prompt_len=ctx.cfg.max_prompt_len,
      rows=ctx.score_rows,
      mesh=ctx.mesh,
    )
  return likelihood.mean_token_prob(logp, mask)
