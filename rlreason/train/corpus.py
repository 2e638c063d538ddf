"""A synthetic pretraining corpus from the procedural tasks.

The laptop base model (experiments/pretrain.py) learns from documents

    [hint line]        knowledge points, in `guidance.hints`' format (share
                       `Mix.hinted`)
    <question>         the task's prompt, as `hints.prompt_text` writes it
    <trace>            a worked solution ending in `answer: <value>`
    <eos>

written by stochastic solvers, so that what it learns is latent and
unreliable skill rather than a lookup table:

- **Slips.** Every step of a trace is wrong with probability
  `slip(d) = step_error * error_growth ** (d - 1)` (capped at 0.5) at
  difficulty d, and the trace goes on from the wrong value: errors grow with
  difficulty and with the number of steps.
- **Strategies.** A share `Mix.textbook` of traces is the task's own
  reference solution (`Problem.solution`, the format hint prefixes are cut
  from). The rest are verbose traces. Arithmetic has two schools: one
  reduces brackets, then *, then + and - (right), the other a shortcut that
  works strictly left to right, ignoring precedence and brackets (right only
  where order does not matter). A verbose trace names its school
  (`order: ...`), restates the question as the school reads it, then
  writes one step per line (`4*2=8, so 3+8`). The shortcut's share is
  `shortcut[0]` at level 1 and `shortcut[1]` above, so at level 1 a
  majority vote is right while the model's most likely trace at higher
  levels is the shortcut's:
  pass@k far above pass@1, and room for RL to move the model's choice.
  `addsub5` (+ and - only) has two schools too, named by the same kind of
  line: left to right (right) and "+, then -" (wrong: `9-3+2` read as
  `9-(3+2)`, a misreading of PEMDAS), with the same shares. Its right
  school takes the first three tokens of the line above at each step, as
  arithmetic's shortcut does: easy to execute, unlike precedence, which
  must find the `*`.
- **Search.** Countdown traces are depth-first searches that write every
  tried combination, `no` at a dead end and `back` when a branch is given
  up; the reference solution's next step is tried first with probability
  `Mix.guided`. Long searches are cut after `Mix.search_lines` tried
  combinations (each open branch then writes its `back`) and end in a
  (wrong) guess: the last expression tried.
- **Checking.** A share `Mix.check` of verbose arithmetic traces re-checks
  every step (`check: 4*2=8 ok, 3+8=12 not 11`): a slip is caught with
  probability 1 - slip and the trace redoes the work from there.
- **Redoing.** Of the verbose arithmetic traces without a check, a share
  `Mix.redo` of those whose first pass slipped (a tenth of that share of
  the others, `traces.REDO_QUIET`) works the problem again from the
  question (`again: 9-3+2`, the same school, fresh slips) until two passes
  agree or three are written, and answers with the last pass's value: two
  to three times the steps, mostly at hard levels where slips are likely
  (the long tail of response lengths that length penalties act on; 0 in
  the default mix, 1.0 for the shipped base).
- **Drills.** A share `Mix.drill` of arithmetic documents (every task the
  arithmetic solver writes: `arithmetic`, `arithmetic5`) are fact drills
  (`facts:` then lines like `8*6=48`, no answer): the slip-free steps of
  both schools on `Mix.drill_problems` problems of the level. Per document
  they hold ~4x the arithmetic facts of a trace, the skill the character
  model was measured to lack (`8*6=46`), meant to leave its errors to the
  choices RL can fix (the school). Measured at 0.25: the base came out
  worse, facts included (experiments/pretrain.py's docstring).
- **Hints.** A share `Mix.hinted` shows `hint: ...` (the problem's knowledge
  points: rules and intermediate results, `hints.knowledge_hint`) before the
  question. Hinted traces follow their hint: arithmetic uses the right
  order and copies the given intermediate results without slips, countdown
  tries the given steps first, the others slip at a third of the rate.

Everything is a pure function of `(Mix, seed)`: `documents` draws the same
documents on every machine. Only train-split problems are used (the eval
split of every task stays held out).
"""

import dataclasses
import itertools
import random

from rlreason.data import sources
from rlreason.data import tasks
from rlreason.guidance import hints as hints_lib
from rlreason.train import search_traces
from rlreason.train import traces

# Each task's stochastic solver: `SOLVERS[task](problem, rng, mix, hint="")`.
SOLVERS = {**traces.SOLVERS, **search_traces.SOLVERS}


@dataclasses.dataclass(frozen=True)
class Mix:
  """The corpus's knobs (module docstring). `tasks`: (task, share, levels)."""

  # Mostly arithmetic, the main job's task, at the levels whose facts a
  # ~3M-parameter model learns in ~30 CPU minutes (levels 4+ need 2-3 digit
  # products; a first run with 45% arithmetic over levels 1-4 reached 4%
  # pass@1 at level 1).
  tasks: tuple[tuple[str, float, int], ...] = (
    ("arithmetic", 0.7, 3),
    ("countdown", 0.1, 2),
    ("shortest_path", 0.1, 3),
    ("knights", 0.1, 2),
  )
  step_error: float = 0.04
  error_growth: float = 1.5
  shortcut: tuple[float, float] = (0.3, 0.6)
  textbook: float = 0.15
  check: float = 0.35
  redo: float = 0.0
  hinted: float = 0.15
  guided: float = 0.6
  search_lines: int = 14
  problems_per_level: int = 2000
  # Opt-in (0 = the shipped base's corpus); 0.25 made a weaker base
  # (experiments/pretrain.py).
  drill: float = 0.0
  drill_problems: int = 4

  def slip(self, difficulty: int) -> float:
    return min(self.step_error * self.error_growth ** (difficulty - 1), 0.5)

  def validate(self):
    for name, share, levels in self.tasks:
      task = tasks.get(name)
      if name not in SOLVERS:
        raise ValueError(
          f"Mix.tasks: {name} has no solver (corpus.SOLVERS: {sorted(SOLVERS)})"
        )
      if share <= 0 or not 1 <= levels <= task.max_difficulty:
        raise ValueError(
          f"Mix.tasks: {name} needs share > 0 and levels in "
          f"[1, {task.max_difficulty}], got {share}, {levels}"
        )
    for field in (
      "step_error",
      "textbook",
      "check",
      "redo",
      "hinted",
      "guided",
      "drill",
    ):
      if not 0 <= getattr(self, field) <= 1:
        raise ValueError(f"Mix.{field} must be in [0, 1]")
    if self.drill_problems < 1:
      raise ValueError("Mix.drill_problems must be >= 1")
    if not all(0 <= s <= 1 for s in self.shortcut):
      raise ValueError("Mix.shortcut must be two shares in [0, 1]")


# ------------------------------------------------------------- documents


@dataclasses.dataclass(frozen=True)
class Document:
  """One corpus document: `prompt` (hint + question) then `completion`."""

  task: str
  difficulty: int
  prompt: str
  completion: str
  kind: str  # "textbook" | "trace" | "drill"
  hinted: bool


def document(problem, task: str, rng: random.Random, mix: Mix) -> Document:
  """One document for `problem`, drawn from the mix's distribution."""
  hint = ""
  if problem.knowledge and rng.random() < mix.hinted:
    k = rng.randint(1, len(problem.knowledge))
    hint = hints_lib.knowledge_hint(problem.knowledge, k)
  example = sources.Example(
    uid=problem.uid, question=problem.prompt, answer=problem.answer, hint=hint
  )
  prompt = hints_lib.prompt_text(None, example, "plain")
  if not hint and rng.random() < mix.textbook:
    return Document(
      task, problem.difficulty, prompt, problem.solution, "textbook", False
    )
  completion = SOLVERS[task](problem, rng, mix, hint)
  return Document(
    task, problem.difficulty, prompt, completion, "trace", bool(hint)
  )


def documents(mix: Mix, n: int, seed: int = 0) -> list[Document]:
  """`n` documents, a pure function of (mix, n, seed)."""
  mix.validate()
  rng = random.Random(f"corpus/{seed}")
  pools = {}
  bounds = list(itertools.accumulate(share for _, share, _ in mix.tasks))
  out = []
  for _ in range(n):
    r = rng.random() * bounds[-1]
    k = next((k for k, b in enumerate(bounds) if r < b), len(bounds) - 1)
    name, _, levels = mix.tasks[k]
    d = rng.randint(1, levels)
    if (name, d) not in pools:
      pools[name, d] = _pool(name, d, mix.problems_per_level, seed)
    drills = SOLVERS[name] is traces.arithmetic_trace
    if drills and mix.drill and rng.random() < mix.drill:
      picked = [rng.choice(pools[name, d]) for _ in range(mix.drill_problems)]
      out.append(drill(picked, rng, name))
      continue
    problem = rng.choice(pools[name, d])
    out.append(document(problem, name, rng, mix))
  return out


DRILL_PROMPT = "facts:"


def drill(problems, rng: random.Random, task: str = "arithmetic") -> Document:
  """A fact drill: the slip-free steps (`4*2=8`) of both arithmetic
  schools on `problems`, one per line, shuffled; no answer line."""
  facts = []
  for p in problems:
    for shortcut in (False, True):
      for fact in traces.arithmetic_facts(p.prompt, shortcut):
        if fact not in facts:
          facts.append(fact)
  rng.shuffle(facts)
  return Document(
    task,
    max(p.difficulty for p in problems),
    DRILL_PROMPT,
    "\n".join(facts),
    "drill",
    False,
  )


def _pool(name: str, difficulty: int, n: int, seed: int):
  """Up to n distinct train problems (fewer where the level has fewer)."""
  return tasks.get(name).problems(
    "train", n, difficulty, seed, allow_fewer=True
  )
