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
  where order does not matter). The shortcut's share is `shortcut[0]` at
  level 1 and `shortcut[1]` above, so at level 1 a majority vote is right
  while the model's most likely trace at higher levels is the shortcut's:
  pass@k far above pass@1, and room for RL to move the model's choice.
- **Search.** Countdown traces are depth-first searches that write every
  tried combination, `no` at a dead end and `back` when a branch is given
  up; the reference solution's next step is tried first with probability
  `Mix.guided`. Long searches are cut after `Mix.search_lines` tried
  combinations (each open branch then writes its `back`) and end in a
  (wrong) guess: the last expression tried.
- **Checking.** A share `Mix.check` of verbose arithmetic traces re-checks
  every step (`check: 4*2=8 ok, 3+8=12 not 11`): a slip is caught with
  probability 1 - slip and the trace redoes the work from there.
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
import re

from rlreason.data import sources
from rlreason.data import tasks
from rlreason.data.tasks import base
from rlreason.data.tasks import countdown as countdown_lib
from rlreason.guidance import hints as hints_lib

ANSWER = base.ANSWER_PREFIX


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
  hinted: float = 0.15
  guided: float = 0.6
  search_lines: int = 14
  problems_per_level: int = 2000

  def slip(self, difficulty: int) -> float:
    return min(self.step_error * self.error_growth ** (difficulty - 1), 0.5)

  def validate(self):
    for name, share, levels in self.tasks:
      task = tasks.get(name)
      if share <= 0 or not 1 <= levels <= task.max_difficulty:
        raise ValueError(
          f"Mix.tasks: {name} needs share > 0 and levels in "
          f"[1, {task.max_difficulty}], got {share}, {levels}"
        )
    for field in ("step_error", "textbook", "check", "hinted", "guided"):
      if not 0 <= getattr(self, field) <= 1:
        raise ValueError(f"Mix.{field} must be in [0, 1]")
    if not all(0 <= s <= 1 for s in self.shortcut):
      raise ValueError("Mix.shortcut must be two shares in [0, 1]")


# ------------------------------------------------------------ arithmetic

_ARITH_TOKEN = re.compile(r"\d+|[-+*()]")
_PREC = {"+": 1, "-": 1, "*": 2}
RIGHT_ORDER = "order: ( ), then *, then + -"
SHORTCUT_ORDER = "order: left to right"


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
  """The shortcut's reading: numbers and operators, brackets dropped."""
  return [
    t if t in _PREC else int(t)
    for t in _ARITH_TOKEN.findall(text)
    if t not in "()"
  ]


def _slipped(value: int, rng: random.Random) -> int:
  wrong = value + rng.choice((-2, -1, 1, 1, 2, 10, -10))
  return wrong if wrong >= 0 and wrong != value else value + 1


def _arith_steps(prompt: str, shortcut: bool):
  """The solver's state machine: yields states, (op, a, b, next) per step."""
  if shortcut:
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
  else:
    state = parse_expression(prompt[:-1])

    def step(s):
      return _first_step(s)[:3]

    def after(s, v):
      return _put(s, _first_step(s)[3], v)

    def done(s):
      return isinstance(s, int)

    show = tasks.arithmetic.render

    def value(s):
      return s

  return state, step, after, done, show, value


def arithmetic_trace(problem, rng, mix: Mix, hint: str = "") -> str:
  d = problem.difficulty
  slip = mix.slip(d)
  shortcut_share = mix.shortcut[0 if d == 1 else 1]
  shortcut = not hint and rng.random() < shortcut_share
  given = (
    set(hint.removeprefix(hints_lib.HINT_PREFIX).split("; ")) if hint else set()
  )
  state, step, after, done, show, value = _arith_steps(problem.prompt, shortcut)
  lines = [SHORTCUT_ORDER if shortcut else RIGHT_ORDER]
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
      s = _arith_steps(problem.prompt, shortcut)[0]
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
  lines.append(f"{ANSWER}{value(state)}")
  return "\n".join(lines)


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


def countdown_trace(problem, rng, mix: Mix, hint: str = "") -> str:
  d = problem.difficulty
  slip = mix.slip(d)
  target, numbers = countdown_lib.parse_spec(problem.answer)
  reference = [
    line for line in problem.solution.split("\n")[:-1] if "=" in line
  ]
  given = (
    set(hint.removeprefix(hints_lib.HINT_PREFIX).split("; ")) if hint else set()
  )
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


def shortest_path_trace(problem, rng, mix: Mix, hint: str = "") -> str:
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


def knights_trace(problem, rng, mix: Mix, hint: str = "") -> str:
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
  "countdown": countdown_trace,
  "shortest_path": shortest_path_trace,
  "knights": knights_trace,
}


# ------------------------------------------------------------- documents


@dataclasses.dataclass(frozen=True)
class Document:
  """One corpus document: `prompt` (hint + question) then `completion`."""

  task: str
  difficulty: int
  prompt: str
  completion: str
  kind: str  # "textbook" | "trace"
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
    problem = rng.choice(pools[name, d])
    out.append(document(problem, name, rng, mix))
  return out


def _pool(name: str, difficulty: int, n: int, seed: int):
  """Up to n distinct train problems (fewer where the level has fewer)."""
  task = tasks.get(name)
  try:
    return task.problems("train", n, difficulty, seed)
  except ValueError:
    # Small spaces at low levels: take what the split has.
    out, seen = [], set()
    for draw in range(20 * n):
      p = task.generate(seed * 2**32 + draw, difficulty)
      key = task.split_key(p.prompt)
      if key not in seen and base.split_of_key(key) == "train":
        seen.add(key)
        out.append(p)
    return out
