"""Repetition check: a completion that repeats one run of words many times.

RLPR's repetition penalty (the authors' detect_repetition_with_hash, as
their forks carry it): the text is split into words on whitespace and
"_", and a completion is repetitive when some run of `window` consecutive
words occurs `limit` times or more (the authors' scripts: 10 words, 10
times).
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
