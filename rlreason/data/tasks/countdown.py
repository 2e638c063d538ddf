"""Countdown / 24-game: combine all given numbers to reach a target.

Prompt: `use 3 8 to get 24` + newline. Every number must be used exactly once,
with + - * / and parentheses (exact rational arithmetic; no unary minus, no
concatenating digits).
Solution: one line per combination, then the answer line with the expression:

    3*8=24
    answer: 3*8

Gold `answer` (what `verify` receives): the spec `24:3,8` (target, then the
numbers), since any valid expression is correct. Answer value: an expression
over exactly those numbers that evaluates to the target.

Difficulty d: d+1 numbers in [1, 8+4d]. The generator builds a
random expression tree over the numbers whose intermediate results are
positive integers, so a solution always exists.
"""

import fractions
import random
import re

from rlreason.data.tasks import base

_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")
_MAX_EXPR_CHARS = 200
_MAX_DEPTH = 32


class _Parser:
  """Recursive-descent parser for + - * / ( ) over non-negative integers.

  No eval(): the verifier sees model output. Length and nesting are capped.
  """

  def __init__(self, text: str):
    if len(text) > _MAX_EXPR_CHARS:
      raise ValueError("expression too long")
    self.tokens = []
    for m in _TOKEN.finditer(text):
      if m.group(1) is not None:
        if len(m.group(1)) > 1 and m.group(1)[0] == "0":
          raise ValueError("leading zero")
        self.tokens.append(int(m.group(1)))
      elif m.group(2).strip():
        if m.group(2) not in "+-*/()":
          raise ValueError(f"bad character {m.group(2)!r}")
        self.tokens.append(m.group(2))
    self.pos = 0
    self.numbers = []

  def _peek(self):
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def _next(self):
    tok = self._peek()
    self.pos += 1
    return tok

  def parse(self) -> fractions.Fraction:
    value = self._expr(0)
    if self._peek() is not None:
      raise ValueError("trailing tokens")
    return value

  def _expr(self, depth):
    value = self._term(depth)
    while self._peek() in ("+", "-"):
      op = self._next()
      rhs = self._term(depth)
      value = value + rhs if op == "+" else value - rhs
    return value

  def _term(self, depth):
    value = self._atom(depth)
    while self._peek() in ("*", "/"):
      op = self._next()
      rhs = self._atom(depth)
      value = value * rhs if op == "*" else value / rhs  # ZeroDivisionError
    return value

  def _atom(self, depth):
    tok = self._next()
    if isinstance(tok, int):
      self.numbers.append(tok)
      return fractions.Fraction(tok)
    if tok == "(":
      if depth >= _MAX_DEPTH:
        raise ValueError("nesting too deep")
      value = self._expr(depth + 1)
      if self._next() != ")":
        raise ValueError("unbalanced parentheses")
      return value
    raise ValueError(f"unexpected token {tok!r}")


def evaluate(expression: str) -> tuple[fractions.Fraction, list[int]]:
  """Value of an expression and the numbers it uses (raises on bad input)."""
  parser = _Parser(expression)
  return parser.parse(), parser.numbers


def parse_spec(answer: str) -> tuple[int, list[int]]:
  target, numbers = answer.split(":")
  return int(target), [int(x) for x in numbers.split(",")]


def _combine(rng: random.Random, a: int, b: int):
  """A random op on (a, b) with a positive integer result, or None."""
  ops = ["+", "*"]
  if a > b:
    ops.append("-")
  if b > 1 and a % b == 0:
    ops.append("/")
  op = rng.choice(ops)
  value = {"+": a + b, "-": a - b, "*": a * b}.get(op, a // b if b else 0)
  return op, value


class Countdown(base.Task):
  """Reach the target using every number exactly once."""

  name = "countdown"
  max_difficulty = 5

  def _generate(self, rng, difficulty):
    count = difficulty + 1
    hi = 8 + 4 * difficulty
    while True:
      numbers = [rng.randint(1, hi) for _ in range(count)]
      # Combine a random pair of pool items until one is left; each item is
      # (value, expression text, precedence of its top operator).
      pool = [(n, str(n), 3) for n in numbers]
      steps = []
      while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, ea, pa), (b, eb, pb) = pool[i], pool[j]
        if a < b and rng.random() < 0.5:
          (a, ea, pa), (b, eb, pb) = (b, eb, pb), (a, ea, pa)
        op, value = _combine(rng, a, b)
        prec = 1 if op in "+-" else 2
        ea = f"({ea})" if pa < prec else ea
        eb = f"({eb})" if pb < prec or (pb == prec and op in "-/") else eb
        steps.append(f"{a}{op}{b}={value}")
        pool = [p for k, p in enumerate(pool) if k not in (i, j)]
        pool.append((value, ea + op + eb, prec))
      target, expression, _ = pool[0]
      if 1 <= target <= 999:
        break
    prompt = f"use {' '.join(map(str, numbers))} to get {target}\n"
    answer = f"{target}:{','.join(map(str, numbers))}"
    solution = "\n".join(steps) + f"\n{base.ANSWER_PREFIX}{expression}"
    knowledge = ("use every number exactly once",) + tuple(steps)
    return prompt, answer, solution, knowledge

  def split_key(self, prompt):
    numbers, _, target = prompt[4:].strip().partition(" to get ")
    return f"{target}:{sorted(map(int, numbers.split()))}"

  def check(self, value, answer):
    target, numbers = parse_spec(answer)
    result, used = evaluate(value)
    return sorted(used) == sorted(numbers) and result == target
