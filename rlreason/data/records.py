"""Records -> validated Examples: field paths into nested records, the
known datasets' schemas, and each record's checks (the messages name the
file and row). data/sources.py reads the records; its specs' field options
(`question=`, `answer=`, `format=`) arrive here.

  examples_from_records([("f.jsonl: row 0", {"question": "1+1?",
                          "answer": "2"})], {})  # [Example(...)]
"""

import dataclasses
from typing import Any, Iterable

from rlreason.data import extract


class DataError(ValueError):
  """A bad record or spec; the message names the source and the row."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt. `solution` is a reference solution when the source has one
  (tasks, GSM8K rationale, MATH solution), else "".

  For hint-guided methods (rlreason/guidance/hints.py): `knowledge` holds atomic
  knowledge points (procedural tasks supply them), `hint` is guidance shown
  before the question, `hint_after` guidance shown after it (GHPO's
  partial solution in the user message) and `prefix` a partial solution
  the response starts from; all are "" for an ordinary prompt.
  """

  uid: str
  question: str
  answer: str
  solution: str = ""
  difficulty: int = 0
  knowledge: tuple[str, ...] = ()
  hint: str = ""
  prefix: str = ""
  hint_after: str = ""


def _get(record: Any, path: str) -> Any:
  """Follows a dotted path (KeyError if absent); keys match any case."""
  value = record
  for part in path.split("."):
    if isinstance(value, dict):
      if part not in value:
        lower = {str(k).lower(): k for k in value}
        if part.lower() not in lower:
          raise KeyError(path)
        part = lower[part.lower()]
      value = value[part]
    elif isinstance(value, (list, tuple)):
      try:
        value = value[int(part)]
      except (ValueError, IndexError):
        raise KeyError(path) from None
    else:
      raise KeyError(path)
  return value


def _fields(value: Any, prefix: str = "", depth: int = 3) -> list[str]:
  """The dotted paths of a record's fields, nested objects opened `depth`
  levels deep; a list's path says how many items it holds (index them:
  `prompt.-1.content`)."""
  if isinstance(value, dict) and value and depth:
    return [
      path
      for k, v in value.items()
      for path in _fields(v, f"{prefix}{k}.", depth - 1)
    ]
  name = prefix.rstrip(".")
  if isinstance(value, (list, tuple)):
    return [f"{name} (a list of {len(value)})"]
  return [name]


def _has(record, path) -> bool:
  try:
    _get(record, path)
    return True
  except KeyError:
    return False


def detect_schema(record: dict) -> tuple[str, str, str]:
  """(question field, answer field, format) for a known dataset layout."""
  if _has(record, "prompt.-1.content") and _has(
    record, "reward_model.ground_truth"
  ):
    return "prompt.-1.content", "reward_model.ground_truth", "raw"
  if _has(record, "question") and _has(record, "answer"):
    answer = _get(record, "answer")
    fmt = "gsm8k" if isinstance(answer, str) and "####" in answer else "raw"
    return "question", "answer", fmt
  if _has(record, "problem") and _has(record, "answer"):
    return "problem", "answer", "raw"
  if _has(record, "problem") and _has(record, "solution"):
    return "problem", "solution", "boxed"
  raise DataError(
    "unknown schema (fields: "
    f"{sorted(record) if isinstance(record, dict) else type(record)}); "
    "name them in the spec, e.g. path:question_field,answer_field"
  )


def _to_example(record, row: str, fields) -> Example:
  """Validates one record; `row` names it in errors (`file: row 3`)."""
  q_field, a_field, fmt = fields
  if not isinstance(record, dict):
    raise DataError(f"{row}: record is {type(record).__name__}, not an object")
  for field in (q_field, a_field):
    if not _has(record, field):
      shown = _fields(record)
      more = f", ... ({len(shown)} in all)" if len(shown) > 12 else ""
      raise DataError(
        f"{row}: missing field {field!r} (the record has: "
        f"{', '.join(shown[:12])}{more})"
      )
  question, raw = _get(record, q_field), _get(record, a_field)
  if not isinstance(question, str):
    raise DataError(
      f"{row}: field {q_field!r} is {type(question).__name__}, not a string"
    )
  if not question.strip():
    raise DataError(f"{row}: empty question in field {q_field!r}")
  if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
    raise DataError(
      f"{row}: field {a_field!r} is {type(raw).__name__}, not a string"
    )
  raw, solution = str(raw), ""
  if fmt == "gsm8k":
    solution, sep, answer = raw.rpartition("####")
    answer = answer.strip().replace(",", "") if sep else ""
  elif fmt == "boxed":
    solution, answer = raw, extract.last_boxed(raw) or ""
  elif fmt == "raw":
    answer = raw.strip()
  else:
    raise DataError(f"unknown answer format {fmt!r}")
  if not answer:
    raise DataError(f"{row}: no answer in field {a_field!r} (format {fmt})")
  if fmt != "gsm8k" and _has(record, "solution") and a_field != "solution":
    sol = _get(record, "solution")
    solution = sol if isinstance(sol, str) else ""
  return Example(row, question, answer, solution.strip())


def examples_from_records(
  records: Iterable[tuple[str, Any]], options: dict[str, str]
) -> list[Example]:
  """Validated examples from (row name, record) pairs, per the options."""
  out, fields = [], None
  for row, record in records:
    if fields is None:
      if "question" in options and "answer" in options:
        fields = (options["question"], options["answer"])
        fields += (options.get("format", "raw"),)
      elif "question" in options or "answer" in options:
        raise DataError("name both the question and the answer field")
      else:
        try:
          fields = detect_schema(record)
        except DataError as e:
          raise DataError(f"{row}: {e}") from None
        if options.get("format", "auto") != "auto":
          fields = fields[:2] + (options["format"],)
    out.append(_to_example(record, row, fields))
  return out
