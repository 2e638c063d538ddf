"""A rollout's finished rows on disk, so that a stopped rollout's rerun
samples only the rest (rollout.generate's `journal`).

  setting = journal.rollout_setting(tokens, ...)  # what rows depend on
  j = journal.RowJournal(directory, setting)
  ids, held = j.read(rows, width)  # rows kept by an earlier, stopped call
  j.write(ids, sample_output)      # as parts of the rollout finish
  out = journal.in_row_order(rows, [(ids, held), ...])  # [rows, ...] arrays

The journal of one rollout is <directory>/<digest>/, the digest naming
everything else its samples depend on (`setting`: the prompts, keys, step,
sampling and architecture), so a rerun with any of it changed never takes
another's rows; `directory` is the parameters' own (the caller's to name:
the loop's, run_info.rollout_journal, is a step's whose weights are its
checkpoint's). Each part is one .npz file (row indices, tokens, log-probs,
lengths, finish reasons), written to a temporary name and renamed: a
process killed mid-write leaves no torn file. Process 0 alone reads and
writes it (local disk: the caller's directory); the others get its rows by
broadcast, so every process of a multi-host run resumes after the same
rows.
"""

import hashlib
import json
import os
import sys
import zipfile

import jax
import numpy as np

from rlreason import mesh as mesh_lib

# What a part holds: SampleOutput's fields less mask (lengths give it) and
# logits (never journaled).
FIELDS = ("tokens", "logp", "policy_logp", "lengths", "finish")


def setting_digest(setting: dict) -> str:
  """16 hex digits naming `setting` (JSON-able values, others repr'd): a
  journal's name."""
  key = json.dumps(setting, sort_keys=True, default=repr)
  return hashlib.sha256(key.encode()).hexdigest()[:16]


def array_digest(*arrays: np.ndarray) -> str:
  """A host arrays' digest (shape, dtype and bytes), for a setting."""
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(a)
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def rollout_setting(tokens, positions, rng, step, model_cfg,
                    max_new_tokens, sampling, stop_ids, stop_sequences,
                    pad_id, row_offset) -> dict:  # fmt: skip
  """What a rollout's samples depend on beside the parameters (the
  journal's directory is theirs), its journal's name: the prompts, the key
  and step, the sampler's settings and architecture (not how the rows are
  split into calls: each row has its own key)."""
  return dict(
    prompts=array_digest(tokens, positions),
    key=np.asarray(mesh_lib.to_host(jax.random.key_data(rng))).tolist(),
    step=int(np.asarray(mesh_lib.to_host(step))),
    model=repr(model_cfg),
    max_new_tokens=int(max_new_tokens),
    sampling=repr(sampling),
    stops=[list(stop_ids), [list(q) for q in stop_sequences]],
    pad_id=int(pad_id),
    row_offset=int(row_offset),
  )


def in_row_order(n: int, parts) -> dict[str, np.ndarray]:
  """The N rows as host arrays [N, ...] from `parts`, whose (row ids [k],
  {field: those k rows}, the same fields in each) hold every row between
  them (a rollout's: the rows its journal held and those kept as they
  finished)."""
  rows = {}
  for ids, part in parts:
    for k, v in part.items():
      rows.setdefault(k, np.empty((n, *v.shape[1:]), v.dtype))[ids] = v
  return rows


class RowJournal:
  """The finished rows of one rollout (module docstring)."""

  def __init__(self, directory: str, setting: dict):
    self.path = os.path.join(directory, setting_digest(setting))
    self._is_main = jax.process_index() == 0
    self._failed = False  # a write failed: no more are tried

  def read(self, rows: int, width: int):
    """(ids [k], {field: [k, ...]}) of the rows the journal holds, ids
    sorted, on every process; (empty, None) where it holds none. A part
    that cannot be read, or whose shapes are not `rows` rows of `width`
    tokens, is skipped (and later overwritten)."""
    parts = []
    if self._is_main and os.path.isdir(self.path):
      for name in sorted(os.listdir(self.path)):
        if not name.endswith(".npz"):
          continue
        try:
          with np.load(os.path.join(self.path, name)) as f:
            part = {k: f[k] for k in ("ids", *FIELDS)}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
          continue
        ids = part["ids"]
        ok = ids.ndim == 1 and part["tokens"].shape == (len(ids), width)
        if ok and len(ids) and 0 <= ids.min() and ids.max() < rows:
          parts.append(part)
    held = None
    if parts:
      held = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
      _, first = np.unique(held["ids"], return_index=True)
      held = {k: v[first] for k, v in held.items()}  # sorted by id
    held = _from_process_0(held)
    if held is None:
      return np.zeros((0,), np.int64), None
    if self._is_main:
      print(
        f"rollout: {len(held['ids'])} of {rows} sequences from {self.path}",
        file=sys.stderr,
        flush=True,
      )
    return held.pop("ids").astype(np.int64), held

  def write(self, ids: np.ndarray, out) -> None:
    """Keeps rows `ids` [k] of a finished part, `out` a host SampleOutput
    (or any object with FIELDS) of those k rows. A write that fails (a
    full disk) says so once and stops the journal, not the rollout."""
    if not self._is_main or not len(ids) or self._failed:
      return
    ids = np.asarray(ids, np.int32)  # a part's rows: named by its first
    name = os.path.join(self.path, f"part_{ids[0]:09d}_{len(ids)}")
    try:
      os.makedirs(self.path, exist_ok=True)
      with open(name + ".tmp", "wb") as f:
        np.savez(
          f,
          ids=ids,
          **{k: np.asarray(getattr(out, k)) for k in FIELDS},
        )
      os.replace(name + ".tmp", name + ".npz")
    except OSError as e:
      self._failed = True
      print(
        f"rollout: not kept in {self.path} ({e}); a stop now loses the "
        "rollout's rows",
        file=sys.stderr,
        flush=True,
      )


def _from_process_0(held):
  """Process 0's rows (a dict of arrays, or None) on every process."""
  if jax.process_count() == 1:
    return held
  from jax.experimental import multihost_utils

  spec = None
  if held is not None:
    spec = {k: [list(v.shape), v.dtype.str] for k, v in held.items()}
  spec = mesh_lib.from_process_0(spec)
  if spec is None:
    return None
  if held is None:
    held = {k: np.zeros(s, np.dtype(d)) for k, (s, d) in spec.items()}
  return {
    k: np.asarray(multihost_utils.broadcast_one_to_all(v))
    for k, v in held.items()
  }
