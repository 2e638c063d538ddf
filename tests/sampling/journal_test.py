"""Rollout journals: a stopped rollout keeps its finished rows and the rerun
samples only the rest, as one uninterrupted rollout would have."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.model import transformer
from rlreason.sampling import draw
from rlreason.sampling import engine
from rlreason.sampling import journal
from rlreason.sampling import rollout
from rlreason.sampling import sampler as sampling
from tests.sampling.rollout_test import CFG
from tests.sampling.rollout_test import T as T_NEW
from tests.sampling.rollout_test import _assert_same_rollout
from tests.sampling.rollout_test import _generate
from tests.sampling.rollout_test import _train_layout


class Stop(BaseException):
  pass


@pytest.fixture(scope="module")
def params():
  params = transformer.init(CFG, jax.random.key(0))
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8
  return params


def _parts(directory) -> list[str]:
  """The .npz parts of the one journal under `directory`."""
  (digest,) = os.listdir(directory)
  found = sorted(os.listdir(os.path.join(directory, digest)))
  return [f for f in found if f.endswith(".npz")]


def _rows_sampled(monkeypatch) -> list[int]:
  """The rows of each sampler call from now on (padding included)."""
  rows, real = [], rollout._sample_rows

  def spy(*args, **kwargs):
    rows.append(kwargs["rows"])
    return real(*args, **kwargs)

  monkeypatch.setattr(rollout, "_sample_rows", spy)
  return rows


def test_row_keys_take_each_rows_index():
  rng = jax.random.key(3)
  ids = np.array([5, 9, 6], np.uint32)
  each = draw.row_keys(rng, 3, ids)
  for i, row in enumerate(ids):
    np.testing.assert_array_equal(
      jax.random.key_data(each[i]),
      jax.random.key_data(draw.row_keys(rng, 1, row)[0]),
    )
  with pytest.raises(ValueError, match=r"row_offset of shape \(2,\)"):
    draw.row_keys(rng, 3, ids[:2])


def test_a_stopped_static_rollout_resumes_from_its_journal(
  params, tmp_path, monkeypatch, capsys
):
  """8 rows in calls of 3: stopped after the second call, the journal
  holds those 6 rows (2 parts); the rerun samples the last 2 in one call
  (in calls of 2 now: the split does not matter) and its rollout is the
  uninterrupted one's."""
  whole = _generate(params, step=3, rows_per_call=3)
  checks = []

  def stop():
    checks.append(1)
    if len(checks) == 2:
      raise Stop

  with pytest.raises(Stop):
    _generate(params, 3, rows_per_call=3, interrupt=stop, journal=str(tmp_path))
  assert len(_parts(tmp_path)) == 2
  rows = _rows_sampled(monkeypatch)
  resumed = _generate(params, 3, rows_per_call=2, journal=str(tmp_path))
  assert rows == [2]
  assert "rollout: 6 of 8 sequences from" in capsys.readouterr().err
  _assert_same_rollout(resumed, whole)
  np.testing.assert_array_equal(resumed.finish_reasons, whole.finish_reasons)
  np.testing.assert_array_equal(resumed.prompt_ids, whole.prompt_ids)

  # Another step, prompt set or sampling never takes these rows (another
  # policy's rollouts have a journal directory of their own).
  for kw in (
    {"step": 4},
    {"texts": ["1+1=", "2+2="]},
    {"sampling": draw.Sampling(temperature=0.5)},
  ):
    call = {"params": params, "step": 3, **kw}
    rows.clear()
    got = _generate(**call, rows_per_call=3, journal=str(tmp_path))
    assert sum(rows) == 9 if "texts" not in kw else sum(rows) == 6
    assert "rollout:" not in capsys.readouterr().err
    _assert_same_rollout(got, _generate(**call, rows_per_call=3))


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_scattered_kept_rows_leave_the_others_their_own_keys(
  params, tmp_path, monkeypatch, batching
):
  """A journal holding rows 1 and 4 only (a continuous rollout's rows
  finish in any order): the rerun samples rows 0, 2, 3, 5, 6, 7, each
  with its own key, not keys counted from the first."""
  kw = dict(rows_per_call=3, batching=batching)
  whole = _generate(params, 3, **kw)

  def stop():
    raise Stop

  with pytest.raises(Stop):
    _generate(params, 3, rows_per_call=3, interrupt=stop, journal=str(tmp_path))
  (digest,) = os.listdir(tmp_path)  # the rollout's journal: rows 0-2
  os.remove(os.path.join(tmp_path, digest, _parts(tmp_path)[0]))
  j = journal.RowJournal(str(tmp_path), {})
  j.path = os.path.join(tmp_path, digest)
  host = jax.tree.map(np.asarray, whole)
  kept = np.array([1, 4])
  j.write(
    kept,
    sampling.SampleOutput(
      tokens=host.tokens[kept, -T_NEW:],
      logp=host.logp[kept],
      policy_logp=host.policy_logp[kept],
      mask=None,
      lengths=host.lengths[kept],
      finish=(host.finish_reasons[kept] == "eos").astype(np.int32),
    ),
  )
  rows = _rows_sampled(monkeypatch)
  resumed = _generate(params, 3, journal=str(tmp_path), **kw)
  assert sum(rows) == 6
  _assert_same_rollout(resumed, whole)


def test_a_finished_rollout_is_kept_whole(params, tmp_path, monkeypatch):
  """A rollout that ended (in one call here) keeps every row: its rerun (a
  stop came in the work after it) samples none, and gives its rollout."""
  whole = _generate(params, 3, journal=str(tmp_path))
  assert len(_parts(tmp_path)) == 1
  rows = _rows_sampled(monkeypatch)
  _assert_same_rollout(_generate(params, 3, journal=str(tmp_path)), whole)
  assert rows == []


def test_a_stopped_continuous_rollout_resumes_from_its_journal(
  params, tmp_path, monkeypatch, capsys
):
  """Continuous batching (3 slots for 8 rows) on a 2x2x2 mesh, in host
  calls of 2 decode steps: stopped once the journal holds a row, the rerun
  samples only the rows it does not hold (each with its own key); stopped
  again and rerun, it equals the uninterrupted rollout, rows in order."""
  monkeypatch.setattr(engine, "PROGRESS_STEPS", 2)
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  laid = _train_layout(params, mesh)
  kw = dict(mesh=mesh, rows_per_call=3, batching="continuous")
  whole = _generate(laid, 3, **kw)

  def stop_at(parts):  # once the journal holds more than `parts` parts
    def stop():
      if os.listdir(tmp_path) and len(_parts(tmp_path)) > parts:
        raise Stop

    return stop

  def held():
    (digest,) = os.listdir(tmp_path)
    return sum(
      len(np.load(os.path.join(tmp_path, digest, f))["ids"])
      for f in _parts(tmp_path)
    )

  # Stopped twice: the second time, the rows it keeps are the unfinished
  # rows' (their indices among all 8, not among those it sampled).
  with pytest.raises(Stop):
    _generate(laid, 3, interrupt=stop_at(0), journal=str(tmp_path), **kw)
  first = held()
  with pytest.raises(Stop):
    _generate(laid, 3, interrupt=stop_at(1), journal=str(tmp_path), **kw)
  kept = held()
  assert 1 <= first < kept < 8
  capsys.readouterr()
  rows = _rows_sampled(monkeypatch)
  resumed = _generate(laid, 3, journal=str(tmp_path), **kw)
  assert rows == [8 - kept]
  err = capsys.readouterr().err
  assert f"rollout: {kept} of 8 sequences from" in err
  _assert_same_rollout(resumed, whole)
  assert resumed.mask.sharding.is_equivalent_to(whole.mask.sharding, 2)


def test_row_journal_reads_its_parts_in_row_order(tmp_path):
  """Parts are read back sorted by row; a torn file and a part of another
  width are skipped; a journal of another setting holds nothing."""
  j = journal.RowJournal(str(tmp_path), {"a": 1})

  def part(ids, width=4):
    k = len(ids)
    return sampling.SampleOutput(
      tokens=np.arange(k * width, dtype=np.int32).reshape(k, width) + ids[0],
      logp=np.full((k, width), -0.5, np.float32),
      policy_logp=np.full((k, width), -0.25, np.float32),
      mask=None,
      lengths=np.asarray(ids, np.int32) % 4,
      finish=np.ones(k, np.int32),
    )

  j.write(np.array([5, 2]), part([5, 2]))
  j.write(np.array([0]), part([0]))
  j.write(np.array([7]), part([7], width=3))  # another width
  with open(os.path.join(j.path, "part_torn.npz"), "wb") as f:
    f.write(b"PK\x03\x04 not a whole file")
  ids, held = j.read(rows=8, width=4)
  np.testing.assert_array_equal(ids, [0, 2, 5])
  np.testing.assert_array_equal(held["lengths"], [0, 2, 1])
  np.testing.assert_array_equal(held["tokens"][1], part([5, 2]).tokens[1])
  np.testing.assert_array_equal(held["tokens"][2], part([5, 2]).tokens[0])
  assert set(held) == set(journal.FIELDS) - {"ids"}
  ids, held = journal.RowJournal(str(tmp_path), {"a": 2}).read(8, 4)
  assert len(ids) == 0 and held is None


def test_a_journaled_rollout_copies_its_rows_to_the_host_once(
  params, tmp_path, monkeypatch
):
  """Without a journal a rollout copies its sampled tokens to the host once,
  at its end; with one, each sampler call's (the journal's copy), and those
  copies give the texts: nothing is copied again at the end."""
  whole = _generate(params, 3, rows_per_call=3)
  copies, real = [], mesh_lib.to_host

  def spy(tree):  # the rows of each copy of sampled tokens: int [rows, T]
    for x in jax.tree.leaves(tree):
      if np.ndim(x) == 2 and np.issubdtype(x.dtype, np.integer):
        copies.append(len(x))
    return real(tree)

  monkeypatch.setattr(mesh_lib, "to_host", spy)
  _assert_same_rollout(_generate(params, 3, rows_per_call=3), whole)
  assert copies == [8]
  copies.clear()
  got = _generate(params, 3, rows_per_call=3, journal=str(tmp_path))
  _assert_same_rollout(got, whole)
  assert copies == [3, 3, 2]  # 8 rows in calls of 3
  copies.clear()
  resumed = _generate(params, 3, rows_per_call=3, journal=str(tmp_path))
  _assert_same_rollout(resumed, whole)
  assert copies == []  # every row from the journal


def test_a_journal_that_cannot_be_written_leaves_the_rollout_be(
  params, tmp_path, capsys
):
  """The journal's directory under a file (as a full disk, an OSError):
  one line says the rows are not kept; the rollout is sampled as without
  a journal."""
  blocked = tmp_path / "file"
  blocked.write_text("")
  got = _generate(params, 3, rows_per_call=3, journal=str(blocked / "j"))
  err = capsys.readouterr().err
  assert err.count("rollout: not kept in") == 1, err
  _assert_same_rollout(got, _generate(params, 3, rows_per_call=3))


def test_the_journal_benchmark_runs():
  """python -m experiments.bench.rollout_journal at 16 rows through 4
  slots, host calls every 8 decode steps (a process of its own: the bench
  modules define absl flags): both rollouts sample the same tokens
  (checked inside) and the journal kept every row, in several parts."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  proc = subprocess.run(
    [
      sys.executable, "-m", "experiments.bench.rollout_journal",
      "--rows=16", "--slots=4", "--repeats=1", "--progress_steps=8",
    ],
    cwd=root, env={**os.environ, "XLA_FLAGS": testing.xla_flags()},
    capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = proc.stdout.strip().splitlines()[-1]
  kept = re.search(
    r" = [\d.]+x; the journal kept (\d+) rows in (\d+) parts", line
  )
  assert kept and kept.groups()[0] == "16" and int(kept.groups()[1]) > 1, line
  assert line.endswith("(same tokens)"), line
