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


def test_put_back_serves_a_batch_of_waiting_examples_and_resumes():
  """Examples put back wait until a batch of them does (then that batch,
  in their order, without moving the inner iterator); the queue survives
  a JSON round trip of state(), and a checkpoint of a queue-less run
  restores with none waiting."""
  examples = _examples(10)
  cfg = type("Cfg", (), {"batch_size": 3, "seed": 0})
  queue = iterator.PutBack()
  it = queue.wrap()(cfg, examples)
  plain = iterator.PromptIterator(examples, 3, seed=0)
  first = next(it)
  assert _uids([first]) == _uids([next(plain)])
  queue.put_back(first[:2])  # two wait: fewer than a batch
  assert _uids([next(it)]) == _uids([next(plain)])
  queue.put_back(first[2:] + examples[:1])  # four wait
  assert _uids([next(it)]) == _uids([first])  # the first three waiting
  state = json.loads(json.dumps(it.state()))
  assert state["queued"] == ["0"] and state["inner"] == plain.state()
  expected = _uids(next(it) for _ in range(4))
  assert expected == _uids(next(plain) for _ in range(4))  # one waits on
  again = iterator.PutBack()
  resumed = again.wrap()(cfg, examples)
  resumed.restore(state)
  assert again.queue == examples[:1]
  assert _uids(next(resumed) for _ in range(4)) == expected
  resumed.restore(plain.state())  # a checkpoint saved without the queue
  assert again.queue == [] and resumed.state()["inner"] == plain.state()
  with pytest.raises(ValueError, match="uid 'x'.*not in this run"):
    resumed.restore({"inner": plain.state(), "queued": ["x"]})
