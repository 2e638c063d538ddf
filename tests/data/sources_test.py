"""Tests for rlreason.data.sources."""

import json

import pytest

from rlreason.data import sources as data


def _write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


GSM8K = [
  {"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"}
  for i in range(10)
] + [{"question": "Big?", "answer": "so\n#### 1,234"}]
MATH = [
  {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
  {"problem": "Two?", "solution": "Clearly \\boxed{2}"},
]
MATH500 = [{"problem": "P", "solution": "S \\boxed{3}", "answer": "3"}]
AIME = [{"ID": "2024-I-1", "Problem": "Find x.", "Answer": 204}]
DAPO = [
  {
    "data_source": "math_dapo",
    "prompt": [{"role": "user", "content": "Solve 1+1."}],
    "reward_model": {"ground_truth": "2", "style": "rule"},
  }
]


# ---------------------------------------------------------------- spec


@pytest.mark.parametrize(
  "spec, expected",
  [
    ("task:arithmetic", ("task", "arithmetic", {})),
    (
      "task:knights:difficulty=1-3,n=30",
      ("task", "knights", {"difficulty": "1-3", "n": "30"}),
    ),
    (
      "/d/x.jsonl:problem,final",
      ("path", "/d/x.jsonl", {"question": "problem", "answer": "final"}),
    ),
    ("gs://b/x.jsonl", ("path", "gs://b/x.jsonl", {})),
    (
      "hf:openai/gsm8k:config=main",
      ("hf", "openai/gsm8k", {"config": "main"}),
    ),
    ("tfds:gsm8k:split=test", ("tfds", "gsm8k", {"split": "test"})),
  ],
)
def test_parse_spec(spec, expected):
  assert data.parse_spec(spec) == expected


# ---------------------------------------------------------------- schemas


def test_gsm8k_jsonl(tmp_path):
  examples = data.load(_write_jsonl(tmp_path / "gsm.jsonl", GSM8K))
  assert [e.answer for e in examples[:3]] == ["1", "2", "3"]
  assert examples[-1].answer == "1234"  # Thousands separator dropped.
  assert examples[0].question == "What is 0+1?"
  assert examples[0].solution == "0+1=1"


def test_math_boxed_solution_and_answer_field(tmp_path):
  examples = data.load(_write_jsonl(tmp_path / "math.jsonl", MATH))
  assert [e.answer for e in examples] == ["\\frac{1}{2}", "2"]
  examples = data.load(_write_jsonl(tmp_path / "m500.jsonl", MATH500))
  assert examples[0].answer == "3" and examples[0].solution == "S \\boxed{3}"


def test_aime_and_dapo_schemas(tmp_path):
  aime = data.load(_write_jsonl(tmp_path / "aime.jsonl", AIME))
  assert (aime[0].question, aime[0].answer) == ("Find x.", "204")
  dapo = data.load(_write_jsonl(tmp_path / "dapo.jsonl", DAPO))
  assert (dapo[0].question, dapo[0].answer) == ("Solve 1+1.", "2")


def test_generic_field_spec_json_and_parquet(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  records = [{"q": f"question {i}", "gold": str(i)} for i in range(5)]
  pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
  (tmp_path / "d.json").write_text(json.dumps(records))
  for name in ("d.parquet", "d.json"):
    examples = data.load(f"{tmp_path / name}:q,gold")
    assert [e.answer for e in examples] == ["0", "1", "2", "3", "4"]
  nested = [{"x": {"msgs": [{"c": "hi"}]}, "y": 3}]
  path = _write_jsonl(tmp_path / "nested.jsonl", nested)
  examples = data.load(f"{path}:question=x.msgs.-1.c,answer=y")
  assert (examples[0].question, examples[0].answer) == ("hi", "3")


def test_hf_save_to_disk(tmp_path):
  import datasets

  ds = datasets.DatasetDict(
    {
      "train": datasets.Dataset.from_list(GSM8K[:4]),
      "test": datasets.Dataset.from_list(GSM8K[4:6]),
    }
  )
  ds.save_to_disk(str(tmp_path / "gsm"))
  train = data.load(str(tmp_path / "gsm"))
  test = data.load(str(tmp_path / "gsm"), split="test")
  assert [e.answer for e in train] == ["1", "2", "3", "4"]
  assert [e.answer for e in test] == ["5", "6"]
  with pytest.raises(data.DataError, match="no split 'dev'"):
    data.load(str(tmp_path / "gsm"), split="dev")
  # A run's eval data: the held-out split by its hub names.
  assert [e.answer for e in data.load(str(tmp_path / "gsm"), "eval")] == [
    "5",
    "6",
  ]
  with pytest.raises(data.DataError, match=r"no split 'eval'.*split=NAME"):
    data.load(f"{tmp_path / 'gsm'}:split=eval")  # named: no guessing


def test_hf_hub_splits_and_errors(monkeypatch):
  """A hub spec loads every split unless it names one; "eval" is the
  dataset's test / validation split, or its only one (AIME's "train");
  a failed load is a DataError naming the spec."""
  import datasets

  def rows(*answers):
    return datasets.Dataset.from_list(
      [{"question": f"q{a}", "answer": a} for a in answers]
    )

  hub = {
    "u/two": datasets.DatasetDict(
      {"train": rows("1"), "validation": rows("2")}
    ),
    "u/one": datasets.DatasetDict({"train": rows("3")}),
  }
  calls = []

  def load_dataset(repo, config=None, split=None):
    calls.append(split)
    if repo not in hub:
      raise ConnectionError(f"Couldn't reach '{repo}' on the Hub")
    return hub[repo] if split is None else hub[repo][split]

  monkeypatch.setattr(datasets, "load_dataset", load_dataset)

  def answers(spec, split):
    return [e.answer for e in data.load(spec, split)]

  assert answers("hf:u/two", "train") == ["1"]
  assert answers("hf:u/two", "eval") == ["2"]
  assert answers("hf:u/one", "eval") == ["3"]
  assert answers("hf:u/two:split=validation", "train") == ["2"]
  assert calls == [None, None, None, "validation"]
  with pytest.raises(data.DataError, match=r"hf:u/none: ConnectionError"):
    data.load("hf:u/none")


def test_task_source():
  examples = data.load("task:arithmetic:difficulty=1-2,n=10,seed=3")
  assert len(examples) == 10
  assert [e.difficulty for e in examples] == [1] * 5 + [2] * 5
  assert all(e.solution.endswith("answer: " + e.answer) for e in examples)
  evals = data.load("task:arithmetic:difficulty=1-2,n=10", split="eval")
  assert not {e.question for e in evals} & {e.question for e in examples}
  with pytest.raises(data.DataError, match="n="):
    data.load("task:countdown:n=500", split="eval")
  with pytest.raises(data.DataError, match="unknown task"):
    data.load("task:sudoku")


def test_tfds_source_is_optional():
  try:
    import tensorflow_datasets  # noqa: F401
  except ImportError:
    with pytest.raises(data.DataError, match="tensorflow-datasets"):
      data.load("tfds:gsm8k")
  else:
    pytest.skip("tensorflow-datasets installed; needs a network dataset")


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
  "bad, message",
  [
    (
      {"question": "ok?", "meta": {"answers": [1, 2]}},
      r"row 2 \(line 3\): missing field 'answer' \(the record has: "
      r"question, meta.answers \(a list of 2\)\)",
    ),
    ({"question": 5, "answer": "1"}, "row 2 .*'question' is int"),
    ({"question": "  ", "answer": "1"}, "row 2 .*empty question"),
    ({"question": "q", "answer": None}, "row 2 .*'answer' is NoneType"),
    ({"question": "q", "answer": "no hashes"}, "row 2 .*no answer"),
  ],
)
def test_bad_row_names_file_and_row(tmp_path, bad, message):
  path = _write_jsonl(tmp_path / "bad.jsonl", GSM8K[:2] + [bad] + GSM8K[2:])
  with pytest.raises(data.DataError, match=message) as info:
    data.load(path)
  assert str(info.value).startswith(path)


def test_bad_json_and_parquet_rows(tmp_path):
  path = tmp_path / "broken.jsonl"
  path.write_text(json.dumps(GSM8K[0]) + "\n\n{not json\n")
  with pytest.raises(data.DataError, match=r"broken.jsonl: row 1 \(line 3\)"):
    data.load(str(path))
  import pyarrow as pa
  import pyarrow.parquet as pq

  records = [{"q": "a", "a": "1"}, {"q": "", "a": "2"}]
  pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet")
  with pytest.raises(data.DataError, match="p.parquet: row 1: empty"):
    data.load(f"{tmp_path / 'p.parquet'}:q,a")
  with pytest.raises(data.DataError, match="no such file"):
    data.load(str(tmp_path / "missing.jsonl"))
