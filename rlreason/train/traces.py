"""The corpus's stochastic solvers: one worked trace per call.

`SOLVERS[task](problem, rng, mix, hint="")` writes a solution of `problem`
ending in `answer: <value>`, drawing its slips, school, search order and
checks from `rng` with the rates of `mix` (a `corpus.Mix`: `slip(d)`,
`shortcut`, `check`, `guided`, `search_lines`); with a hint (`hint: a; b`,
`hints.knowledge_hint`) it follows the hint. What each solver writes is in
the corpus module's docstring (rlreason/train/corpus.py).
"""

import dataclasses
import random
import re

from rlreason.data import tasks
from rlreason.data.tasks import base
from rlreason.data.tasks import countdown as countdown_lib
from rlreason.guidance import hints as hints_lib

ANSWER = base.ANSWER_PREFIX
REDO = "again: "  # a redo pass's first line: the question restated


def _given(hint: str) -> set[str]:
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


def _slipped(value: int, rng: random.Random) -> int:
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
  given = _given(hint)
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
        v = _slipped(v, rng)
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


# ------------------------------------------------------------- countdown


def _cd_moves(items):
  """Every (i, j, op, value) combining two items into a positive integer."""
  out = []
  for i in range(len(items)):
    for j in range(len(items)):
      if i == j:
        continue
      a, b = items[i][0], items[j][0]
      if i < j:
        out += [(i, j, "+", a + b), (i, j, "*", a * b)]
      if a > b:
        out.append((i, j, "-", a - b))
      if b and a % b == 0 and b != 1:
        out.append((i, j, "/", a // b))
  return out


def _wrap(expr: str) -> str:
  return expr if expr.isdigit() else f"({expr})"


def countdown_trace(problem, rng, mix, hint: str = "") -> str:
  d = problem.difficulty
  slip = mix.slip(d)
  target, numbers = countdown_lib.parse_spec(problem.answer)
  reference = [
    line for line in problem.solution.split("\n")[:-1] if "=" in line
  ]
  given = _given(hint)
  guided = 1.0 if hint else mix.guided
  lines, best = [], [None]

  def dfs(items, depth) -> bool:
    if len(lines) >= mix.search_lines:
      return False
    moves = _cd_moves(items)
    rng.shuffle(moves)
    ref = reference[depth] if depth < len(reference) else ""
    lead = [
      m
      for m in moves
      if f"{items[m[0]][0]}{m[2]}{items[m[1]][0]}={m[3]}" == ref
    ]
    if lead and (ref in given or rng.random() < guided):
      moves.remove(lead[0])
      moves.insert(0, lead[0])
    for i, j, op, v in moves[:3]:
      if len(lines) >= mix.search_lines:
        return False
      (a, ea), (b, eb) = items[i], items[j]
      fact = f"{a}{op}{b}={v}"
      if fact not in given and rng.random() < slip:
        v = _slipped(v, rng)
      expr = f"{_wrap(ea)}{op}{_wrap(eb)}"
      rest = [it for k, it in enumerate(items) if k not in (i, j)] + [(v, expr)]
      if len(rest) == 1:
        best[0] = expr
        ok = v == target
        lines.append(f"{a}{op}{b}={v} " + ("yes" if ok else "no"))
        if ok:
          return True
        continue
      left = " ".join(str(x) for x, _ in rest)
      lines.append(f"{a}{op}{b}={v}, left {left}")
      if dfs(rest, depth + 1):
        return True
      lines.append("back")
    return False

  dfs([(n, str(n)) for n in numbers], 0)
  answer = best[0] or "+".join(str(n) for n in numbers)
  return "\n".join(lines + [f"{ANSWER}{answer}"])


# --------------------------------------------------------- shortest path

_EDGE = re.compile(r"([a-z])-([a-z]) (\d+)")
_QUERY = re.compile(r"([a-z]) to ([a-z])\?")


def shortest_path_trace(problem, rng, mix, hint: str = "") -> str:
  """Dijkstra written out: each settled node with its relaxed neighbours."""
  slip = mix.slip(problem.difficulty) / (3 if hint else 1)
  graph = {}
  for u, v, w in _EDGE.findall(problem.prompt):
    graph.setdefault(u, []).append((v, int(w)))
    graph.setdefault(v, []).append((u, int(w)))
  source, target = _QUERY.search(problem.prompt).groups()
  dist, settled, lines = {source: 0}, set(), []
  while True:
    u = min((n for n in dist if n not in settled), key=lambda n: (dist[n], n))
    settled.add(u)
    if u == target:
      lines.append(f"{u}={dist[u]} done")
      break
    relaxed = []
    for v, w in sorted(graph[u]):
      if v in settled:
        continue
      total = dist[u] + w
      if rng.random() < slip:
        total = _slipped(total, rng)
      relaxed.append(f"{v} {dist[u]}+{w}={total}")
      dist[v] = min(dist.get(v, total), total)
    lines.append(
      f"{u}={dist[u]}" + (": " + ", ".join(relaxed) if relaxed else "")
    )
  return "\n".join(lines + [f"{ANSWER}{dist[target]}"])


# --------------------------------------------------------------- knights


def knights_trace(problem, rng, mix, hint: str = "") -> str:
  """The task's depth-first search, where the solver may accept a complete
  assignment it should have rejected (a missed contradiction) or misread the
  final one."""
  slip = mix.slip(problem.difficulty) / (3 if hint else 1)
  *search, answer_line = problem.solution.split("\n")
  names = [p.split("=")[0] for p in answer_line.removeprefix(ANSWER).split(",")]
  lines = []
  for line in search:
    roles, _, verdict = line.partition(" ")
    if (
      len(roles) == len(names)
      and verdict.startswith("x")
      and rng.random() < slip
    ):
      lines.append(f"{roles} ok")
      break
    lines.append(line)
  roles = lines[-1].split(" ")[0]
  if rng.random() < slip:
    k = rng.randrange(len(roles))
    roles = roles[:k] + ("N" if roles[k] == "K" else "K") + roles[k + 1 :]
  value = ",".join(f"{n}={r}" for n, r in zip(names, roles, strict=True))
  return "\n".join(lines + [f"{ANSWER}{value}"])


SOLVERS = {
  "arithmetic": arithmetic_trace,
  "arithmetic5": arithmetic_trace,
  "addsub5": addsub_trace,
  "countdown": countdown_trace,
  "shortest_path": shortest_path_trace,
  "knights": knights_trace,
}
