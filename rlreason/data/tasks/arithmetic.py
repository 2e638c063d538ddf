"""Multi-step integer arithmetic with +, - and * (and parentheses).

Prompt: the expression followed by `=`, e.g. `3+4*2=`.
Solution: the expression rewritten after each single reduction (the leftmost
operation whose operands are both numbers, respecting precedence and
parentheses), then the answer line:

    3+4*2=3+8
    =11
    answer: 11

(the first line continues the prompt). Answer value: the integer result in
plain decimal (`11`, never `011` or `+11`).

Difficulty d: d+1 operators. d <= 2: single-digit operands, no parentheses;
d >= 3: random expression trees (so parentheses appear), larger operands.
`arithmetic5` (and `arithmetic5_order`) are the same with operands 1-5 up
to d = 4. `addsub5` (and `addsub5_order`) use only + and -, operands 1-5,
no parentheses, d = 1..3 (read left to right: `9-3+2` is 8).
Intermediate results are kept non-negative.

`arithmetic_order` (`OrderSensitive`) draws only the problems whose answer
changes when the expression is read strictly left to right, ignoring
precedence and brackets (`3+4*2`: 11, not 14): the problems on which the
pretraining corpus's two schools of arithmetic (rlreason/train/traces.py)
disagree, so a model's choice of school decides them. Same prompts,
answers and split as `arithmetic` (an `arithmetic_order` problem is an
`arithmetic` problem of the same split). `addsub5_order` draws the
`addsub5` problems whose answer changes when additions are done before
subtractions (`9-3+2` read as `9-(3+2)`: 4, not 8), the misreading of
"PEMDAS" the corpus's wrong school of +/- follows.
"""

import random
import re

from rlreason.data.tasks import base

_PREC = {"+": 1, "-": 1, "*": 2}
_INT = re.compile(r"-?(0|[1-9][0-9]*)")

# A tree is an int (leaf) or a tuple (op, left, right).


def _value(tree) -> int:
  if isinstance(tree, int):
    return tree
  op, a, b = tree
  a, b = _value(a), _value(b)
  return a + b if op == "+" else a - b if op == "-" else a * b


def render(tree, parent_prec: int = 0, right: bool = False) -> str:
  """Renders with the parentheses needed to parse back to the same tree.

  A right child of equal precedence is parenthesised too (`9-(3-2)`,
  `2*(3*4)`), so reading the string left to right with the usual precedence
  always rebuilds this tree, and the reduction steps match the text.
  """
  if isinstance(tree, int):
    return str(tree)
  op, a, b = tree
  prec = _PREC[op]
  text = render(a, prec) + op + render(b, prec, right=True)
  if prec < parent_prec or (right and prec == parent_prec):
    return "(" + text + ")"
  return text


def _reduce_once(tree):
  """Reduces the leftmost operation whose operands are numbers."""
  op, a, b = tree
  if isinstance(a, int) and isinstance(b, int):
    return _value(tree), (a, op, b)
  if not isinstance(a, int):
    a, step = _reduce_once(a)
    return (op, a, b), step
  b, step = _reduce_once(b)
  return (op, a, b), step


def left_to_right_value(expression: str) -> int:
  """`expression` read strictly left to right, brackets dropped:
  `3+4*2` -> 14, `2*(3+4)` -> 10."""
  items = re.findall(r"[0-9]+|[-+*]", expression)
  value = int(items[0])
  for op, b in zip(items[1::2], items[2::2], strict=True):
    value = _value((op, value, int(b)))
  return value


def plus_first_tree(expression: str):
  """`expression` (+ and - only) read with + binding tighter than -:
  `9-3+2` -> ("-", 9, ("+", 3, 2))."""
  items = re.findall(r"[0-9]+|[-+]", expression)
  return _parse_flat([int(n) for n in items[::2]], items[1::2], tight="+")


def plus_first_value(expression: str) -> int:
  """`expression` with additions before subtractions: `9-3+2` -> 4."""
  return _value(plus_first_tree(expression))


def _parse_flat(numbers: list[int], ops: list[str], tight: str = "*"):
  """Builds the precedence tree of `n0 op0 n1 op1 n2 ...` (no parentheses)
  where `tight` binds tighter than the other operators."""
  terms, term_ops, term = [], [], numbers[0]
  for op, num in zip(ops, numbers[1:], strict=True):
    if op == tight:
      term = (tight, term, num)
    else:
      terms.append(term)
      term_ops.append(op)
      term = num
  terms.append(term)
  tree = terms[0]
  for op, t in zip(term_ops, terms[1:], strict=True):
    tree = (op, tree, t)
  return tree


def _random_tree(rng: random.Random, n_ops: int, hi: int):
  if n_ops == 0:
    return rng.randint(1, hi)
  left = rng.randint(0, n_ops - 1)
  op = rng.choice("+-*")
  return (
    op,
    _random_tree(rng, left, hi),
    _random_tree(rng, n_ops - 1 - left, hi),
  )


def _nonnegative(tree) -> bool:
  if isinstance(tree, int):
    return True
  return _value(tree) >= 0 and _nonnegative(tree[1]) and _nonnegative(tree[2])


def _has_op(tree, ops: str) -> bool:
  if isinstance(tree, int):
    return False
  return tree[0] in ops or _has_op(tree[1], ops) or _has_op(tree[2], ops)


class Arithmetic(base.Task):
  """Evaluate an integer expression step by step.

  `max_operand` caps the operands at levels <= 4 (9: single digits;
  `arithmetic5` draws 1-5, fewer facts for a laptop base to learn:
  measured in experiments/pretrain.py's docstring). `ops` are the
  operators drawn; without "*" every level is a flat chain (no
  parentheses) and `max_difficulty` is 3.
  """

  name = "arithmetic"
  max_difficulty = 8

  def __init__(self, name: str = "", max_operand: int = 9, ops: str = "+-*"):
    self.name = name or type(self).name
    self.max_operand = max_operand
    self.ops = ops
    if "*" not in ops:
      self.max_difficulty = 3

  def misreading(self, expression: str) -> int:
    """The value the corpus's wrong school reads (module docstring)."""
    if "*" in self.ops:
      return left_to_right_value(expression)
    return plus_first_value(expression)

  def _generate(self, rng, difficulty):
    n_ops = difficulty + 1
    hi = self.max_operand if difficulty <= 4 else 20
    while True:
      if difficulty <= 2 or "*" not in self.ops:
        numbers = [rng.randint(1, hi) for _ in range(n_ops + 1)]
        tree = _parse_flat(
          numbers, [rng.choice(self.ops) for _ in range(n_ops)]
        )
      else:
        tree = _random_tree(rng, n_ops, hi)
      # Keep every intermediate non-negative: no unary minus in the text.
      if _nonnegative(tree) and _value(tree) < 10**6:
        break
    prompt = render(tree) + "="
    lines, facts = [], []
    while not isinstance(tree, int):
      tree, (a, op, b) = _reduce_once(tree)
      facts.append(f"{a}{op}{b}={_value((op, a, b))}")
      lines.append(render(tree))
    answer = str(tree)
    solution = lines[0] + "".join("\n=" + l for l in lines[1:])
    solution += f"\n{base.ANSWER_PREFIX}{answer}"
    knowledge = []
    if "(" in prompt:
      knowledge.append("work inside parentheses first")
    if "*" in prompt and ("+" in prompt or "-" in prompt):
      knowledge.append("multiply before adding or subtracting")
    if "*" not in self.ops and "-" in prompt and "+" in prompt:
      knowledge.append("add and subtract from left to right")
    return prompt, answer, solution, tuple(knowledge + facts)

  def check(self, value, answer):
    return _INT.fullmatch(value) is not None and int(value) == int(answer)


class OrderSensitive(Arithmetic):
  """Arithmetic problems that the wrong school's reading (`misreading`:
  left to right, or + before - for `addsub5`) gets wrong (module
  docstring). Of `arithmetic`'s problems, 13% qualify at difficulty 1, 32%
  at 2 and 71% at 3 (400 eval problems each)."""

  name = "arithmetic_order"

  def _generate(self, rng, difficulty):
    while True:
      prompt, answer, solution, knowledge = super()._generate(rng, difficulty)
      if str(self.misreading(prompt.rstrip("="))) != answer:
        return prompt, answer, solution, knowledge
