"""Knights and knaves (the Logic-RL setting, compact notation).

Knights always tell the truth, knaves always lie. Each person makes one
statement; the puzzle has exactly one consistent assignment.

Prompt: one line per person, `A: B knave and A knight`. Statement forms:
`X knight`, `X knave`, `P and Q`, `P or Q` (P, Q are such atoms), and from
difficulty 3 also `if P then Q` and `X same as Y`.
Solution: a depth-first search over roles (knight first) in prompt order. Each
line is a partial assignment with `x N` when person N's statement is
contradicted, and the full assignment with `ok` at the end:

    KK x A
    KN ok
    answer: A=K,B=N

Answer value: `NAME=K` (knight) or `NAME=N` (knave) for every person in prompt
order, comma-separated, no spaces.

Difficulty d: d+1 people (2 to 8); names are distinct random capital letters
listed alphabetically.
"""

import itertools
import string

from rlreason.data.tasks import base

# A statement is (kind, *args): ("is", who, knight: bool), ("and", s1, s2),
# ("or", s1, s2), ("if", s1, s2), ("same", x, y).


def truth(statement, roles: dict[str, bool]) -> bool:
  kind = statement[0]
  if kind == "is":
    return roles[statement[1]] == statement[2]
  if kind == "same":
    return roles[statement[1]] == roles[statement[2]]
  a, b = truth(statement[1], roles), truth(statement[2], roles)
  return {"and": a and b, "or": a or b, "if": (not a) or b}[kind]


def text(statement) -> str:
  kind = statement[0]
  if kind == "is":
    return f"{statement[1]} {'knight' if statement[2] else 'knave'}"
  if kind == "same":
    return f"{statement[1]} same as {statement[2]}"
  if kind == "if":
    return f"if {text(statement[1])} then {text(statement[2])}"
  return f"{text(statement[1])} {kind} {text(statement[2])}"


def people(statement) -> set[str]:
  if statement[0] == "is":
    return {statement[1]}
  if statement[0] == "same":
    return {statement[1], statement[2]}
  return people(statement[1]) | people(statement[2])


def solutions(names, statements) -> list[dict[str, bool]]:
  """All consistent assignments (brute force; at most 2^8 of them)."""
  out = []
  for values in itertools.product((True, False), repeat=len(names)):
    roles = dict(zip(names, values, strict=True))
    if all(
      truth(s, roles) == roles[n]
      for n, s in zip(names, statements, strict=True)
    ):
      out.append(roles)
  return out


def search_trace(names, statements) -> list[str]:
  """The reference depth-first search, one line per dead end plus the end."""
  lines = []

  def dfs(roles):
    k = len(roles)
    for who, s in zip(names, statements, strict=True):
      if who in roles and people(s) <= roles.keys():
        if truth(s, roles) != roles[who]:
          code = "".join("K" if roles[n] else "N" for n in names[:k])
          lines.append(f"{code} x {who}")
          return False
    if k == len(names):
      lines.append("".join("K" if roles[n] else "N" for n in names) + " ok")
      return True
    return any(dfs({**roles, names[k]: v}) for v in (True, False))

  dfs({})
  return lines


def format_roles(names, roles) -> str:
  return ",".join(f"{n}={'K' if roles[n] else 'N'}" for n in names)


class KnightsKnaves(base.Task):
  """Who is a knight and who is a knave?"""

  name = "knights"
  max_difficulty = 7

  def _statement(self, rng, names, difficulty):
    def atom():
      return ("is", rng.choice(names), rng.random() < 0.5)

    kinds = ["is", "is", "and", "or"]
    if difficulty >= 3:
      kinds += ["if", "same"]
    kind = rng.choice(kinds)
    if kind == "is":
      return atom()
    if kind == "same":
      return ("same", *rng.sample(names, 2))
    return (kind, atom(), atom())

  def _unique_statements(self, rng, names, roles, difficulty):
    def consistent_statement(who):
      # A knight's statement is true and a knave's is false under `roles`.
      while True:
        s = self._statement(rng, names, difficulty)
        if truth(s, roles) == roles[who]:
          return s

    statements = [consistent_statement(who) for who in names]
    # Resample one statement at a time until the puzzle is uniquely solvable.
    for _ in range(200):
      if len(solutions(names, statements)) == 1:
        return statements
      i = rng.randrange(len(names))
      statements[i] = consistent_statement(names[i])
    return None

  def _generate(self, rng, difficulty):
    n = difficulty + 1
    while True:
      names = sorted(rng.sample(string.ascii_uppercase, n))
      roles = {name: rng.random() < 0.5 for name in names}
      statements = self._unique_statements(rng, names, roles, difficulty)
      if statements is not None:
        break
    prompt = "".join(
      f"{w}: {text(s)}\n" for w, s in zip(names, statements, strict=True)
    )
    answer = format_roles(names, roles)
    solution = "\n".join(search_trace(names, statements))
    solution += f"\n{base.ANSWER_PREFIX}{answer}"
    knowledge = (
      "a knight's statement is true",
      "a knave's statement is false",
    ) + tuple(f"{w} is a {'knight' if roles[w] else 'knave'}" for w in names)
    return prompt, answer, solution, knowledge

  def split_key(self, prompt):
    # Names are presentation: rename them A, B, C... in prompt order.
    names = [line.split(":")[0] for line in prompt.strip().split("\n")]
    table = str.maketrans(
      dict(zip(names, string.ascii_uppercase, strict=False))
    )
    return prompt.translate(table)

  def check(self, value, answer):
    return value == answer
