"""Shared pieces of the procedural tasks: `Problem`, `Task`, answer lines.

Answer convention (all procedural tasks). A completion ends with one line

    answer: <value>

and nothing but whitespace after it. `extract_answer` is strict: the last
non-empty line must start with exactly `answer: ` (lower case, one space) and
the value must be non-empty with no surrounding spaces; anything else extracts
nothing and scores 0. Each task defines the value's format (an integer, an
expression, `A=K,B=N`). The reference solution of every problem ends with such
a line, so a model warm-started on the solutions learns the convention.

Splits. A problem belongs to the eval split iff the hash of its canonical key
falls in a held-out bucket (1 in `EVAL_BUCKETS`), so train and eval can never
share a prompt, whatever seeds, counts or difficulties are asked for. The key
(`Task.split_key`) is the prompt with presentation choices removed (number
order in countdown, names in knights, edge order in shortest path), so a
relabelled copy of a train problem is never an eval problem.
"""

import abc
import dataclasses
import hashlib
import random

ANSWER_PREFIX = "answer: "
EVAL_BUCKETS = 10  # 10% of the problem space is held out for evaluation.
SPLITS = ("train", "eval")
_PATIENCE = 5000


@dataclasses.dataclass(frozen=True)
class Problem:
  """One generated problem.

  Attributes:
    prompt: the question text (printable ASCII and newlines only).
    answer: the gold answer passed to `Task.verify` (the task's value format;
      for countdown a `target:numbers` spec, see that module).
    solution: a reference step-by-step completion ending with `answer: ...`.
    difficulty: the difficulty the problem was generated at.
    knowledge: atomic facts / hints (rules used, intermediate results), for
      hint-guided methods.
    uid: a stable id, `<task>-d<difficulty>-<hash of the prompt>`.
  """

  prompt: str
  answer: str
  solution: str
  difficulty: int
  knowledge: tuple[str, ...]
  uid: str


def extract_answer(completion: str) -> str | None:
  """Returns the value of the final `answer: ` line, or None (strict)."""
  text = completion.rstrip()
  line = text[text.rfind("\n") + 1 :]
  if not line.startswith(ANSWER_PREFIX):
    return None
  value = line[len(ANSWER_PREFIX) :]
  if not value or value != value.strip():
    return None
  return value


def is_ascii_text(text: str) -> bool:
  """True iff `text` is printable ASCII plus newlines (the tiny vocabulary)."""
  return all(c == "\n" or " " <= c <= "~" for c in text)


def prompt_hash(prompt: str) -> str:
  return hashlib.sha256(prompt.encode()).hexdigest()


def split_of_key(key: str) -> str:
  """The split of a canonical key: 'eval' for 1 bucket in EVAL_BUCKETS."""
  bucket = int(prompt_hash(key)[:8], 16) % EVAL_BUCKETS
  return "eval" if bucket == 0 else "train"


class Task(abc.ABC):
  """A procedural task: generator, exact verifier and difficulty knob.

  Subclasses set `name` and `max_difficulty` and implement `_generate` and
  `check`.
  """

  name: str = ""
  max_difficulty: int = 1

  @abc.abstractmethod
  def _generate(
    self, rng: random.Random, difficulty: int
  ) -> tuple[str, str, str, tuple[str, ...]]:
    """Returns (prompt, answer, solution, knowledge)."""

  @abc.abstractmethod
  def check(self, value: str, answer: str) -> bool:
    """Whether an extracted answer value is correct for the gold `answer`."""

  def split_key(self, prompt: str) -> str:
    """Canonical form of a prompt for splitting and de-duplication."""
    return prompt

  def split_of(self, prompt: str) -> str:
    """'train' or 'eval': the split a prompt of this task belongs to."""
    return split_of_key(self.split_key(prompt))

  def generate(self, seed: int, difficulty: int) -> Problem:
    """Generates one problem, a pure function of (seed, difficulty)."""
    if not 1 <= difficulty <= self.max_difficulty:
      raise ValueError(
        f"{self.name}: difficulty must be in [1, {self.max_difficulty}],"
        f" got {difficulty}"
      )
    # A str seed is hashed with sha512 by `random`: stable across runs and
    # platforms, unlike hash().
    rng = random.Random(f"{self.name}/{difficulty}/{seed}")
    prompt, answer, solution, knowledge = self._generate(rng, difficulty)
    uid = f"{self.name}-d{difficulty}-{prompt_hash(prompt)[:12]}"
    return Problem(prompt, answer, solution, difficulty, knowledge, uid)

  def verify(self, completion: str, answer: str) -> float:
    """1.0 iff the completion's final answer line is correct, else 0.0."""
    value = extract_answer(completion)
    if value is None:
      return 0.0
    try:
      return 1.0 if self.check(value, answer) else 0.0
    except (ValueError, ArithmeticError, RecursionError):
      return 0.0

  def problems(
    self,
    split: str,
    n: int,
    difficulty: int,
    seed: int = 0,
    allow_fewer: bool = False,
  ) -> list[Problem]:
    """`n` distinct problems of one split, deterministic in all arguments.

    Args:
      split: "train" or "eval"; the two never share a split key.
      n: number of problems.
      difficulty: in [1, max_difficulty].
      seed: selects the stream of generator seeds.
      allow_fewer: return the distinct problems found when the split holds
        fewer than `n`, instead of raising.

    Returns:
      A list of `n` problems with distinct split keys (with allow_fewer, at
      most `n`).

    Raises:
      ValueError: if the split holds fewer than `n` distinct problems that the
        generator reaches (small spaces at low difficulty), unless
        allow_fewer.
    """
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out, seen, draws, misses = [], set(), 0, 0
    # Give up after _PATIENCE draws in a row bring nothing new: the space of
    # distinct problems of this split is (practically) exhausted.
    while len(out) < n and misses < _PATIENCE:
      problem = self.generate(seed * 2**32 + draws, difficulty)
      draws += 1
      key = self.split_key(problem.prompt)
      if key in seen or split_of_key(key) != split:
        misses += 1
        continue
      seen.add(key)
      out.append(problem)
      misses = 0
    if len(out) < n and not allow_fewer:
      raise ValueError(
        f"{self.name}: only {len(out)} distinct {split} problems at"
        f" difficulty {difficulty} after {draws} draws; asked for {n}"
      )
    return out
