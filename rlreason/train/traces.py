"""The corpus's stochastic solvers of arithmetic: one worked trace per call.

`SOLVERS[task](problem, rng, mix, hint="")` writes a solution of `problem`
ending in `answer: <value>`, drawing its slips, school, search order and
checks from `rng` with the rates of `mix` (a `corpus.Mix`: `slip(d)`,
`shortcut`, `check`, `guided`, `search_lines`); with a hint (`hint: a; b`,
`hints.knowledge_hint`) it follows the hint. What each solver writes is in
the corpus module's docstring (rlreason/train/corpus.py); the search
tasks' solvers (countdown, shortest path, knights) are in search_traces.py,
on the helpers here (`hint_points`, `slipped_value`).
"""

import dataclasses
import random
import re

from rlreason.data import tasks
from rlreason.data.tasks import base
from rlreason.guidance import hints as hints_lib

ANSWER = base.ANSWER_PREFIX
REDO = "again: "  # a redo pass's first line: the question restated


def hint_points(hint: str) -> set[str]:
  """The knowledge points a hint line shows."""
  if not hint:
    return set()
  return set(hint.removeprefix(hints_lib.HINT_PREFIX).split("; "))


# ------------------------------------------------------------ arithmetic

_ARITH_TOKEN = re.compile(r"\d+|[-+*()]")
_PREC = {"+": 1, "-": 1, "*": 2}
RIGHT_ORDER = "order: ( ), then *, then + -"
SHORTCUT_ORDER = "order: left to right"
PLUS_FIRST_ORDER = "order: +, then -"


@dataclasses.dataclass(frozen=True)
class Schools:
  """A task's two schools: how each reads the question (a `_steps`
  reading) and the order line that names it."""

  right: str
  wrong: str
  right_line: str
  wrong_line: str


# `arithmetic`: precedence vs strictly left to right. `addsub5` (+ and -
# only): left to right is right; the wrong school adds before it subtracts.
ARITHMETIC_SCHOOLS = Schools("precedence", "flat", RIGHT_ORDER, SHORTCUT_ORDER)
ADDSUB_SCHOOLS = Schools("flat", "plus_first", SHORTCUT_ORDER, PLUS_FIRST_ORDER)


def parse_expression(text: str):
  """`3+4*2` -> ("+", 3, ("*", 4, 2)); left-associative, usual precedence."""
  toks = _ARITH_TOKEN.findall(text)
  pos = 0

  def atom():
    nonlocal pos
    tok = toks[pos]
    pos += 1
    if tok == "(":
      tree = expr(1)
      pos += 1  # ")"
      return tree
    return int(tok)

  def expr(min_prec):
    nonlocal pos
    left = atom()
    while (
      pos < len(toks) and toks[pos] in _PREC and _PREC[toks[pos]] >= min_prec
    ):
      op = toks[pos]
      pos += 1
      left = (op, left, expr(_PREC[op] + 1))
    return left

  return expr(1)


def _apply(op: str, a: int, b: int) -> int:
  return a + b if op == "+" else a - b if op == "-" else a * b


def _first_step(tree):
  """(op, a, b, path) of the leftmost operation with two number operands."""
  op, a, b = tree
  if isinstance(a, int) and isinstance(b, int):
    return op, a, b, ()
  if not isinstance(a, int):
    *step, path = _first_step(a)
    return (*step, (1,) + path)
  *step, path = _first_step(b)
  return (*step, (2,) + path)


def _put(tree, path, value):
  if not path:
    return value
  parts = list(tree)
  parts[path[0]] = _put(tree[path[0]], path[1:], value)
  return tuple(parts)


def _flat(text: str) -> list:
  """The left-to-right reading: numbers and operators, brackets dropped."""
  return [
    t if t in _PREC else int(t)
    for t in _ARITH_TOKEN.findall(text)
    if t not in "()"
  ]


def slipped_value(value: int, rng: random.Random) -> int:
  """A slip's wrong value: off by 1, 2 or 10, never negative or right."""
  wrong = value + rng.choice((-2, -1, 1, 1, 2, 10, -10))
  return wrong if wrong >= 0 and wrong != value else value + 1


def _steps(prompt: str, reading: str):
  """A reading's state machine: (state, step, after, done, show, value);
  step(state) is (op, a, b), after(state, v) the next state. Readings:
  "flat" (strictly left to right, brackets dropped), "precedence" (the
  usual) and "plus_first" (+ binds tighter than -, shown without
  brackets)."""
  if reading == "flat":
    state = _flat(prompt[:-1])

    def step(s):
      return s[1], s[0], s[2]

    def after(s, v):
      return [v] + s[3:]

    def done(s):
      return len(s) == 1

    def show(s):
      return "".join(str(t) for t in s)

    def value(s):
      return s[0]

    return state, step, after, done, show, value
  if reading == "precedence":
    state, show = parse_expression(prompt[:-1]), tasks.arithmetic.render
  else:
    state = tasks.arithmetic.plus_first_tree(prompt[:-1])

    def show(s):
      return tasks.arithmetic.render(s).replace("(", "").replace(")", "")

  def step(s):
    return _first_step(s)[:3]

  def after(s, v):
    return _put(s, _first_step(s)[3], v)

  def done(s):
    return isinstance(s, int)

  def value(s):
    return s

  return state, step, after, done, show, value


def arithmetic_facts(prompt: str, shortcut: bool) -> list[str]:
  """The slip-free steps of one school on `prompt`: ["4*2=8", "3+8=11"]."""
  state, step, after, done, _, _ = _steps(
    prompt, "flat" if shortcut else "precedence"
  )
  facts = []
  while not done(state):
    op, a, b = step(state)
    v = _apply(op, a, b)
    facts.append(f"{a}{op}{b}={v}")
    state = after(state, v)
  return facts


# A redo's rate relative to `Mix.redo` after a first pass without a slip:
# solvers mostly redo work that went wrong (a sense of doubt), sometimes not.
REDO_QUIET = 0.1


def _redo_share(mix, steps) -> float:
  """The chance of a redo pass after the first pass's `steps`."""
  slipped = any(v != _apply(op, a, b) for op, a, b, v in steps)
  return mix.redo if slipped else mix.redo * REDO_QUIET


def _school_trace(problem, rng, mix, hint: str, schools: Schools) -> str:
  d = problem.difficulty
  slip = mix.slip(d)
  shortcut_share = mix.shortcut[0 if d == 1 else 1]
  wrong = not hint and rng.random() < shortcut_share
  reading = schools.wrong if wrong else schools.right
  given = hint_points(hint)
  state, step, after, done, show, value = _steps(problem.prompt, reading)
  # The school's reading of the question, restated next to the steps that
  # copy from it: the operands of a step are then one line up, not behind
  # the order line (a character model learns that copy far sooner).
  lines = [schools.wrong_line if wrong else schools.right_line, show(state)]
  steps = []  # (op, a, b, written value)

  def run(s):
    while not done(s):
      op, a, b = step(s)
      v = _apply(op, a, b)
      if f"{a}{op}{b}={v}" not in given and rng.random() < slip:
        v = slipped_value(v, rng)
      steps.append((op, a, b, v))
      s = after(s, v)
      lines.append(f"{a}{op}{b}={v}" + ("" if done(s) else f", so {show(s)}"))
    return s

  state = run(state)
  if rng.random() < mix.check:
    checked = []
    for i, (op, a, b, v) in enumerate(steps):
      right = _apply(op, a, b)
      caught = v != right and rng.random() >= slip
      if not caught:
        checked.append(f"{a}{op}{b}={v} ok")
        continue
      checked.append(f"{a}{op}{b}={right} not {v}")
      lines.append("check: " + ", ".join(checked))
      # Redo from the corrected step: replay the earlier steps' values.
      s = _steps(problem.prompt, reading)[0]
      for _, _, _, w in steps[:i]:
        s = after(s, w)
      s = after(s, right)
      lines.append(
        f"{a}{op}{b}={right}" + ("" if done(s) else f", so {show(s)}")
      )
      del steps[:]
      state = run(s)
      break
    else:
      lines.append("check: " + ", ".join(checked))
  elif mix.redo and rng.random() < _redo_share(mix, steps):
    # Work it again from the question (fresh slips), until two passes agree
    # or three are written; the answer is the last pass's value (the one
    # two passes agree on, where two do).
    found = [value(state)]
    while len(found) < 3 and len(set(found)) == len(found):
      del steps[:]
      start = _steps(problem.prompt, reading)[0]
      lines.append(f"{REDO}{show(start)}")
      state = run(start)
      found.append(value(state))
  lines.append(f"{ANSWER}{value(state)}")
  return "\n".join(lines)


def arithmetic_trace(problem, rng, mix, hint: str = "") -> str:
  """`arithmetic`'s schools: precedence (right) or left to right."""
  return _school_trace(problem, rng, mix, hint, ARITHMETIC_SCHOOLS)


def addsub_trace(problem, rng, mix, hint: str = "") -> str:
  """`addsub5`'s schools: left to right (right) or + before -."""
  return _school_trace(problem, rng, mix, hint, ADDSUB_SCHOOLS)


SOLVERS = {
  "arithmetic": arithmetic_trace,
  "arithmetic5": arithmetic_trace,
  "addsub5": addsub_trace,
}
