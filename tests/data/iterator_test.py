"""Tests for rlreason.data.iterator."""

import json

import pytest

from rlreason.data import iterator
from rlreason.data import sources


def _examples(n):
  return [sources.Example(str(i), f"q{i}", str(i)) for i in range(n)]


def _uids(batches):
  return [[e.uid for e in b] for b in batches]


def test_same_seed_same_order_and_epochs_are_permutations():
  it = iterator.PromptIterator(_examples(10), 4, seed=1)
  first = _uids(next(it) for _ in range(5))  # 20 items: two epochs.
  again = _uids(
    next(iterator.PromptIterator(_examples(10), 4, seed=1)) for _ in [0]
  )
  assert first[0] == again[0]
  flat = sum(first, [])
  assert sorted(flat[:10]) == sorted(flat[10:]) == sorted(map(str, range(10)))
  assert flat[:10] != flat[10:]  # Each epoch has its own order.
  other = iterator.PromptIterator(_examples(10), 4, seed=2)
  assert _uids([next(other)]) != first[:1]


def test_resume_from_saved_state_continues_identically():
  it = iterator.PromptIterator(_examples(7), 3, seed=0)
  for _ in range(4):
    next(it)
  state = it.state()
  assert state == {"epoch": 1, "index": 5}
  assert all(type(v) is int for v in state.values())
  expected = _uids(next(it) for _ in range(6))
  resumed = iterator.PromptIterator(_examples(7), 3, seed=0)
  resumed.restore(json.loads(json.dumps(state)))  # Survives a JSON round trip.
  assert _uids(next(resumed) for _ in range(6)) == expected
  seeked = iterator.PromptIterator(_examples(7), 3, seed=0)
  seeked.seek(4)
  assert _uids(next(seeked) for _ in range(6)) == expected


def test_processes_shard_the_global_batch():
  examples = _examples(10)
  whole = iterator.PromptIterator(examples, 4, seed=3)
  shards = [
    iterator.PromptIterator(
      examples, 4, seed=3, process_index=p, process_count=2
    )
    for p in range(2)
  ]
  for _ in range(5):
    expected = [e.uid for e in next(whole)]
    assert sum(_uids(next(s) for s in shards), []) == expected
  with pytest.raises(ValueError, match="divisible"):
    iterator.PromptIterator(examples, 3, process_count=2)
