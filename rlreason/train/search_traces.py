"""The corpus's stochastic solvers of the search tasks: countdown, shortest
path, knights and knaves; one worked trace per call, as traces.py's
arithmetic ones (`SOLVERS[task](problem, rng, mix, hint="")`; what each
writes is in rlreason/train/corpus.py's docstring).
"""

import re

from rlreason.data.tasks import countdown as countdown_lib
from rlreason.train import traces

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
  given = traces.hint_points(hint)
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
        v = traces.slipped_value(v, rng)
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
  return "\n".join(lines + [f"{traces.ANSWER}{answer}"])


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
        total = traces.slipped_value(total, rng)
      relaxed.append(f"{v} {dist[u]}+{w}={total}")
      dist[v] = min(dist.get(v, total), total)
    lines.append(
      f"{u}={dist[u]}" + (": " + ", ".join(relaxed) if relaxed else "")
    )
  return "\n".join(lines + [f"{traces.ANSWER}{dist[target]}"])


# --------------------------------------------------------------- knights


def knights_trace(problem, rng, mix, hint: str = "") -> str:
  """The task's depth-first search, where the solver may accept a complete
  assignment it should have rejected (a missed contradiction) or misread the
  final one."""
  slip = mix.slip(problem.difficulty) / (3 if hint else 1)
  *search, answer_line = problem.solution.split("\n")
  names = [
    p.split("=")[0] for p in answer_line.removeprefix(traces.ANSWER).split(",")
  ]
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
  return "\n".join(lines + [f"{traces.ANSWER}{value}"])


SOLVERS = {
  "countdown": countdown_trace,
  "shortest_path": shortest_path_trace,
  "knights": knights_trace,
}
