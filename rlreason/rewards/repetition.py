"""Repetition checks: completions that loop.

`repeats`, RLPR's repetition penalty (the authors' detect_repetition_with_
hash, as their forks carry it): the text is split into words on
whitespace and "_", and a completion is repetitive when some run of
`window` consecutive words occurs `limit` times or more (the authors'
scripts: 10 words, 10 times).

`loop_start` / `loops`, LASER-DE's check on token ids (hkust-nlp/Laser
compute_unique_tokens.py, detect_token_ngram_repetition_optimized_
reversed), which keeps its exploration bonus from long wrong answers that
merely repeat themselves.
"""

import collections
import re
from typing import Sequence

import numpy as np

_SPLIT = re.compile(r"[\s_]+")


def repeats(
  completions: Sequence[str], *, window: int = 10, limit: int = 10
) -> np.ndarray:
  """[N] bool: some `window` consecutive words occur >= `limit` times.

  repeats(["a b a b a b"], window=2, limit=3) == [True] ("a b" 3 times).
  """
  out = []
  for text in completions:
    words = [w for w in _SPLIT.split(text) if w]
    counts = collections.Counter(
      tuple(words[i : i + window]) for i in range(len(words) - window + 1)
    )
    out.append(bool(counts) and max(counts.values()) >= limit)
  return np.asarray(out, bool)


def loop_start(tokens: Sequence[int]) -> int:
  """Where a completion's tokens start to repeat, len(tokens) if nowhere.

  The LASER authors' rule, scanning from the end: with m tokens (m <= 8:
  no loop), n-grams of n = 2 (m < 30), 3 (m < 100) or 4 tokens; a loop is
  an n-gram seen `need` times (2, or 3 from m = 200) with two consecutive
  sightings fewer than m // 3 tokens apart (n-grams of one repeated token
  are skipped for n > 2), and it starts at the n-gram's first sighting;
  failing that, the first of two equal 2n-grams. On natural text the
  n-gram test is strict; on a character-level vocabulary it fires on
  almost every completion (a digit pair seen twice), as the authors' code
  would.

  loop_start([4, 1, 2, 1, 2, 5, 6, 7, 8, 9]) == 1: (1, 2) at 1 and 3, 2 < 10
  // 3 tokens apart; loop_start(range(10)) == 10.
  """
  t = [int(x) for x in tokens]
  m = len(t)
  if m <= 8:
    return m
  n = 2 if m < 30 else 3 if m < 100 else 4
  need = 2 if m < 200 else 3
  seen = collections.defaultdict(list)
  for i in range(m - n, -1, -1):
    gram = tuple(t[i : i + n])
    if n > 2 and len(set(gram)) == 1:
      continue
    seen[gram].append(i)  # descending positions
    at = seen[gram]
    if len(at) >= need and any(a - b < m // 3 for a, b in zip(at, at[1:])):
      return at[-1]
  if m >= 4 * n:
    first = {}
    for i in range(m - 2 * n, -1, -1):
      pattern = tuple(t[i : i + 2 * n])
      if pattern in first:
        return i  # below the later sighting
      first[pattern] = i
  return m


def loops(tokens, lengths) -> np.ndarray:
  """[N] bool: completion r (tokens[r, :lengths[r]]) loops (`loop_start`).

  Args:
    tokens: [N, T] completion token ids (any array-like).
    lengths: [N] completion lengths.
  """
  tokens = np.asarray(tokens)
  lengths = np.asarray(lengths, np.int64)
  return np.asarray(
    [loop_start(row[:k]) < k for row, k in zip(tokens, lengths)], bool
  )
