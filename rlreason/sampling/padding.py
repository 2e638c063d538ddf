"""Host-side batch layout: prompts left-padded to a bucketed length, and
prompt + completion pairs packed into a training batch.

  tokens, positions = padding.pad_prompts(prompts, pad_id, max_len=512)
  batch = padding.pack(prompts, completions, pad_id, 512, 1024)

Positions count from each sequence's first real token; padding has
position -1 (the model's attention masks it). P, the padded prompt length,
is rounded up to a bucket so that batches of similar lengths share one
compiled program.
"""

from typing import Sequence

import numpy as np


def bucket_length(n: int, bucket: int) -> int:
  """n rounded up to a multiple of `bucket` (bucket <= 1: n itself)."""
  if bucket <= 1:
    return n
  return -(-n // bucket) * bucket


def prompt_length(longest: int, bucket: int, max_len: int | None) -> int:
  """P of pad_prompts for a batch whose longest prompt has `longest`
  tokens: rounded up to `bucket`, capped at max_len."""
  p = bucket_length(longest, bucket)
  return p if max_len is None else min(p, max_len)


def pad_prompts(
  prompts: Sequence[Sequence[int]],
  pad_id: int,
  *,
  max_len: int | None = None,
  bucket: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token-id lists into a [B, P] batch with positions.

  P is the longest prompt rounded up to a multiple of `bucket`, capped at
  `max_len`, so that prompt batches of similar lengths share one compiled
  sampler.

  Args:
    prompts: B lists of token ids, each non-empty.
    pad_id: id written on the left padding.
    max_len: the prompt budget; a longer prompt is an error (None: no cap).
    bucket: P is a multiple of this (1: the exact longest length).

  Returns:
    tokens [B, P] int32 and positions [B, P] int32 (0.. from the first real
    token, -1 on padding), as numpy arrays.

  Raises:
    ValueError: no prompts, an empty prompt, or one longer than max_len.
  """
  if len(prompts) == 0:
    raise ValueError("No prompts to pad")
  lengths = [len(p) for p in prompts]
  empty = [i for i, n in enumerate(lengths) if n == 0]
  if empty:
    raise ValueError(
      f"Prompts {empty[:5]} are empty (0 tokens); every "
      "prompt needs at least one token"
    )
  longest = max(lengths)
  if max_len is not None and longest > max_len:
    i = int(np.argmax(lengths))
    raise ValueError(
      f"Prompt {i} has {longest} tokens, more than the prompt "
      f"budget max_len={max_len}; truncate it or raise "
      "max_prompt_len"
    )
  p = prompt_length(longest, bucket, max_len)
  tokens = np.full((len(prompts), p), pad_id, np.int32)
  positions = np.full((len(prompts), p), -1, np.int32)
  for i, ids in enumerate(prompts):
    n = len(ids)
    tokens[i, p - n :] = ids
    positions[i, p - n :] = np.arange(n)
  return tokens, positions


def pack(
  prompts: list[list[int]],
  completions: list[list[int]],
  pad_id: int,
  max_prompt_len: int,
  max_new_tokens: int,
) -> dict[str, np.ndarray]:
  """Left-padded prompts + right-padded completions -> a training batch.

  Completions longer than max_new_tokens are cut (their tail has no loss).

  Returns:
    tokens, positions [N, P + T]; mask [N, T] (1 on completion tokens).
  """
  tokens, positions = pad_prompts(prompts, pad_id, max_len=max_prompt_len)
  n, p = tokens.shape
  t = max_new_tokens
  comp = np.full((n, t), pad_id, np.int32)
  mask = np.zeros((n, t), np.float32)
  for i, ids in enumerate(completions):
    ids = ids[:t]
    comp[i, : len(ids)] = ids
    mask[i, : len(ids)] = 1
  start = positions.max(axis=1, keepdims=True) + 1  # first completion pos
  comp_pos = np.where(mask > 0, start + np.arange(t)[None], -1)
  return {
    "tokens": np.concatenate([tokens, comp], 1),
    "positions": np.concatenate([positions, comp_pos], 1).astype(np.int32),
    "mask": mask,
  }
