r"""Prompt datasets: a data spec -> validated Examples (batched by iterator.py).

Data spec grammar (the `--data` flag):

    SPEC    := SOURCE [":" OPTIONS]
    SOURCE  := "task:" NAME       a procedural task (rlreason.data.tasks)
             | "hf:" REPO_ID      the Hugging Face hub (datasets.load_dataset)
             | "tfds:" NAME       tensorflow-datasets (optional dependency)
             | PATH               a .jsonl / .json / .parquet file, a folder
                                  of .parquet files, or a folder written by
                                  datasets' save_to_disk
    OPTIONS := ITEM ("," ITEM)*
    ITEM    := KEY "=" VALUE | FIELD

The first two bare FIELDs name the question and answer fields. Keys:
  question, answer  field paths; dots index into nested records and lists
                    (`reward_model.ground_truth`, `prompt.-1.content`).
  format            how the answer field becomes the answer: `raw`, `gsm8k`
                    (text after '####', commas dropped), `boxed` (last
                    \boxed{} of a solution), or `auto` (default: by schema).
  split             dataset split (default: the `split` argument of `load`,
                    "train" or "eval"; for a dataset with named splits,
                    "eval" is its eval / test / validation split, and a
                    dataset of one split is that split).
  config            hf dataset config name.
  difficulty, n, seed   task options: `difficulty=2` or `difficulty=1-3`
                    (n split evenly across the range), n problems (default
                    1000), generator seed stream (default 0).

Examples:
    task:arithmetic:difficulty=1-3,n=3000
    /data/gsm8k/train.jsonl                       (schema detected)
    /data/mine.parquet:problem,final_answer
    /data/dapo17k:question=prompt.-1.content,answer=reward_model.ground_truth
    hf:openai/gsm8k:config=main
    hf:HuggingFaceH4/MATH-500:split=test

Schemas detected without field options (first match wins): DAPO-Math-17k
(`prompt` chat list + `reward_model.ground_truth`), GSM8K (`question`,
`answer` with '####'), MATH-500 / AIME (`problem`, `answer`), MATH
(`problem`, `solution` with \boxed{}), and `question`/`answer`. Field names
match case-insensitively (AIME sets use `Problem`/`Answer`).
"""

import functools
import glob
import json
import os
from typing import Any, Iterator

import numpy as np

from rlreason.data import tasks
from rlreason.data.records import DataError, Example, examples_from_records

__all__ = ["DataError", "Example", "check", "load", "parse_spec"]


# --------------------------------------------------------------- spec parsing


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
  """Splits a spec into (kind, location, options); kind in task/hf/tfds/path."""
  kind = "path"
  for prefix in ("task", "hf", "tfds"):
    if spec.startswith(prefix + ":"):
      kind, spec = prefix, spec[len(prefix) + 1 :]
  location, options = spec, {}
  # Options follow the last ':' unless that part looks like a path (so
  # gs://bucket/x.jsonl keeps its colon).
  head, sep, tail = spec.rpartition(":")
  if sep and head and "/" not in tail and os.sep not in tail:
    location, bare = head, []
    for item in filter(None, (s.strip() for s in tail.split(","))):
      if "=" in item:
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
      else:
        bare.append(item)
    if len(bare) > 2:
      raise DataError(f"{spec!r}: at most two bare fields (question,answer)")
    for key, field in zip(("question", "answer"), bare, strict=False):
      options.setdefault(key, field)
  if not location:
    raise DataError(f"empty data source in spec {spec!r}")
  return kind, location, options


# --------------------------------------------------------------- sources


def _jsonl_records(path: str) -> Iterator[tuple[str, Any]]:
  with open(path) as f:
    row = 0
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(
          f"{path}: row {row} (line {lineno}): bad JSON: {e}"
        ) from None
      yield f"{path}: row {row} (line {lineno})", record
      row += 1


def _file_records(path: str) -> Iterator[tuple[str, Any]]:
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq

    for row, record in enumerate(pq.read_table(path).to_pylist()):
      yield f"{path}: row {row}", record
  elif path.endswith(".json"):
    with open(path) as f:
      text = f.read()
    try:
      records = json.loads(text)
    except json.JSONDecodeError:
      records = None  # Probably JSON lines under a .json name.
    if isinstance(records, list):
      for row, record in enumerate(records):
        yield f"{path}: row {row}", record
    else:
      yield from _jsonl_records(path)
  else:
    yield from _jsonl_records(path)


# The splits a run's "train" / "eval" data come from, first found first,
# where the spec names none (hub datasets call the held-out split "test" or
# "validation"); a dataset of one split (AIME's "train") is that split.
_SPLITS = {"train": ("train",), "eval": ("eval", "test", "validation")}


def _split_of(splits, split: str, explicit: bool, name: str) -> str:
  """The split of a dataset with `splits` that `split` means."""
  if split in splits:
    return split
  if not explicit:
    found = [s for s in _SPLITS.get(split, ()) if s in splits]
    if found or len(splits) == 1:
      return (found or list(splits))[0]
  raise DataError(
    f"{name}: no split {split!r}; has {sorted(splits)} (name one: "
    f"{name}:split=NAME)"
  )


def _hf_records(
  ds, name: str, split: str, explicit: bool = True
) -> Iterator[tuple[str, Any]]:
  import datasets

  if isinstance(ds, datasets.DatasetDict):
    split = _split_of(ds, split, explicit, name)
    ds = ds[split]
  for row, record in enumerate(ds):
    yield f"{name}[{split}]: row {row}", record


def _path_records(
  path: str, split: str, explicit: bool
) -> Iterator[tuple[str, Any]]:
  if os.path.isdir(path):
    markers = ("dataset_info.json", "state.json", "dataset_dict.json")
    if any(os.path.exists(os.path.join(path, m)) for m in markers):
      import datasets

      ds = datasets.load_from_disk(path)
      yield from _hf_records(ds, path, split, explicit)
      return
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    if not files:
      raise DataError(f"{path}: no dataset (save_to_disk folder or .parquet)")
    for file in files:
      yield from _file_records(file)
  else:
    yield from _file_records(path)  # load checked that it exists


def _tfds_records(name: str, split: str) -> Iterator[tuple[str, Any]]:
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError(
      "tfds: sources need tensorflow-datasets (pip install rlreason[tfds])"
    ) from None
  for row, record in enumerate(tfds.as_numpy(tfds.load(name, split=split))):
    yield f"tfds:{name}[{split}]: row {row}", _decode(record)


def _decode(value):
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, dict):
    return {k: _decode(v) for k, v in value.items()}
  if isinstance(value, np.ndarray) and value.dtype == object:
    return [_decode(v) for v in value.tolist()]
  if isinstance(value, np.generic):
    return value.item()
  return value


def check(spec: str) -> None:
  """What a spec names exists, without reading any of it: the spec parses,
  a task is registered, a local path is there (DataError otherwise), so a
  command can say so before it loads a model."""
  kind, location, _ = parse_spec(spec)
  if kind == "task":
    try:
      tasks.get(location)
    except KeyError as e:  # str(KeyError) adds quotes
      raise DataError(f"task:{location}: {e.args[0]}") from None
  elif kind == "path" and not os.path.exists(location):
    raise DataError(
      f"{location}: no such file (and not a task:/hf:/tfds: spec)"
    )


def _task_examples(name: str, split: str, options) -> list[Example]:
  task = tasks.get(name)  # load checked it
  if split not in tasks.base.SPLITS:
    raise DataError(
      f"task:{name}: no split {split!r}; a task has {tasks.base.SPLITS}"
    )
  spec = options.get("difficulty", "1")
  lo, _, hi = spec.partition("-")
  difficulties = list(
    range(
      _int_option(name, "difficulty", lo, spec),
      1 + _int_option(name, "difficulty", hi or lo, spec),
    )
  )
  if not difficulties:
    raise DataError(f"task:{name}: difficulty={spec} is an empty range")
  n = _int_option(name, "n", options.get("n", "1000"))
  seed = _int_option(name, "seed", options.get("seed", "0"))
  out = []
  for k, d in enumerate(difficulties):
    count = n // len(difficulties) + (k < n % len(difficulties))
    try:
      out += _generated(task, split, count, d, seed)
    except ValueError as e:
      raise DataError(f"task:{name}: {e} (ask for fewer with n=)") from None
  return out


def _int_option(task: str, key: str, value: str, shown: str = "") -> int:
  try:
    return int(value)
  except ValueError:
    raise DataError(
      f"task:{task}: {key}={shown or value} is not an integer"
      + (" or a range lo-hi" if key == "difficulty" else "")
    ) from None


@functools.lru_cache(maxsize=64)
def _generated(
  task: tasks.Task, split: str, n: int, difficulty: int, seed: int
) -> tuple[Example, ...]:
  """task.problems(...) as Examples, memoised: a run loads its spec several
  times (warm start, training, evaluation), generation is a pure function
  of these arguments, and Examples are immutable."""
  return tuple(
    Example(p.uid, p.prompt, p.answer, p.solution, difficulty, p.knowledge)
    for p in task.problems(split, n, difficulty, seed=seed)
  )


def load(spec: str, split: str = "train") -> list[Example]:
  """Loads and validates the examples named by a data spec (see module doc).

  Raises:
    DataError: a bad spec or record; the message names file and row.
  """
  check(spec)
  kind, location, options = parse_spec(spec)
  explicit = "split" in options
  split = options.get("split", split)
  if kind == "task":
    return _task_examples(location, split, options)
  if kind == "hf":
    import datasets

    try:  # every split, unless the spec names one (_split_of picks)
      ds = datasets.load_dataset(
        location, options.get("config"), split=split if explicit else None
      )
    except Exception as e:  # no network and not cached, no such repo, ...
      raise DataError(
        f"hf:{location}: {type(e).__name__}: {e} (without a network, point "
        "--data / --eval_data at a local .jsonl / .parquet file or a "
        "save_to_disk folder)"
      ) from None
    records = _hf_records(ds, f"hf:{location}", split, explicit)
  elif kind == "tfds":
    records = _tfds_records(location, split)
  else:
    records = _path_records(location, split, explicit)
  examples = examples_from_records(records, options)
  if not examples:
    raise DataError(f"{spec}: no records")
  return examples
