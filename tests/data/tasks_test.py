"""Tests for rlreason.data.tasks."""

import itertools
import random
import re

import pytest

from rlreason.data import tasks
from rlreason.data.tasks import arithmetic
from rlreason.data.tasks import base
from rlreason.data.tasks import countdown

NAMES = tasks.names()


def _answer_line(value: str) -> str:
  return base.ANSWER_PREFIX + value


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("name", NAMES)
def test_reference_solutions_verify_at_every_difficulty(name):
  task = tasks.get(name)
  for d in range(1, task.max_difficulty + 1):
    for seed in range(15):
      p = task.generate(seed, d)
      assert task.verify(p.solution, p.answer) == 1.0, (p.prompt, p.solution)
      assert base.extract_answer(p.solution) is not None
      assert base.is_ascii_text(p.prompt + p.solution + p.answer)
      assert all(base.is_ascii_text(k) for k in p.knowledge) and p.knowledge
      assert p.difficulty == d and p.uid.startswith(f"{name}-d{d}-")


@pytest.mark.parametrize("name", NAMES)
def test_generate_is_deterministic(name):
  task = tasks.get(name)
  assert task.generate(7, 2) == task.generate(7, 2)
  prompts = {task.generate(s, 2).prompt for s in range(20)}
  assert len(prompts) > 15


@pytest.mark.parametrize("name", NAMES)
def test_easiest_level_is_short(name):
  # The tiny char-level model must learn difficulty 1 after a short SFT.
  task = tasks.get(name)
  problems = [task.generate(s, 1) for s in range(200)]
  max_prompt = 50 if name == "knights" else 40
  assert max(len(p.prompt) for p in problems) <= max_prompt
  assert max(len(p.solution) for p in problems) <= 60


def test_bad_difficulty_raises():
  with pytest.raises(ValueError, match="difficulty"):
    tasks.get("arithmetic").generate(0, 0)
  with pytest.raises(KeyError, match="unknown task"):
    tasks.get("sudoku")


# ---------------------------------------------------------------- splits


@pytest.mark.parametrize("name", NAMES)
def test_splits_are_deterministic_and_never_overlap(name):
  task = tasks.get(name)
  train = task.problems("train", 150, 2, seed=0)
  evals = task.problems("eval", 15, 2, seed=0)
  assert train == task.problems("train", 150, 2, seed=0)
  assert len({p.prompt for p in train}) == 150
  other_seed = task.problems("eval", 15, 2, seed=1)
  train_prompts = {p.prompt for p in train}
  for p in evals + other_seed:
    assert p.prompt not in train_prompts
    assert task.split_of(p.prompt) == "eval"
  assert all(task.split_of(p.prompt) == "train" for p in train)


def test_split_key_ignores_presentation():
  cd, kk, sp = (tasks.get(n) for n in ("countdown", "knights", "shortest_path"))
  assert cd.split_key("use 3 8 2 to get 22\n") == cd.split_key(
    "use 8 2 3 to get 22\n"
  )
  assert cd.split_key("use 3 8 to get 24\n") != cd.split_key(
    "use 3 8 to get 11\n"
  )
  assert kk.split_key("J: Z knave\nZ: J knight\n") == kk.split_key(
    "A: B knave\nB: A knight\n"
  )
  assert sp.split_key("a-b 2, b-c 1. a to c?\n") == sp.split_key(
    "b-c 1, a-b 2. a to c?\n"
  )
  for name in NAMES:  # Every generated prompt has a key.
    task = tasks.get(name)
    p = task.generate(0, 3)
    assert task.split_of(p.prompt) in ("train", "eval")


def test_exhausted_split_raises():
  with pytest.raises(ValueError, match="distinct eval problems"):
    tasks.get("countdown").problems("eval", 60, 1)
  # allow_fewer: every distinct problem the split holds, the same as asking
  # for exactly that many.
  task = tasks.get("countdown")
  some = task.problems("eval", 60, 1, allow_fewer=True)
  assert 0 < len(some) < 60
  assert len({task.split_key(p.prompt) for p in some}) == len(some)
  assert some == task.problems("eval", len(some), 1)


# ---------------------------------------------------------------- verifiers


def test_extract_answer_is_strict():
  assert base.extract_answer("x\nanswer: 11") == "11"
  assert base.extract_answer("x\nanswer: 11\n\n  ") == "11"
  for bad in [
    "answer: 11\nmore text",
    "Answer: 11",
    "answer:11",
    "answer:  11",
    "answer: ",
    "the answer: 11",
    "11",
    "",
  ]:
    assert base.extract_answer(bad) is None, bad


def _perturbations(name, p):
  """Wrong completions derived from the reference solution."""
  body, _, value = p.solution.rpartition("\n")
  value = value[len(base.ANSWER_PREFIX) :]
  wrong = []
  if name in ("arithmetic", "shortest_path"):
    wrong += [
      str(int(value) + 1),
      str(int(value) - 1),
      "0" + value,
      "+" + value,
    ]
  elif name == "countdown":
    target, numbers = countdown.parse_spec(p.answer)
    wrong += [
      value + "+1",  # Extra number.
      f"({value})*{numbers[0]}",  # Number used twice.
      re.sub(r"[-+*/]", lambda m: "+" if m.group() != "+" else "-", value),
      str(target),  # Just the target.
      value + "/0",
    ]
  elif name == "knights":
    i = value.index("=") + 1
    wrong.append(value[:i] + ("N" if value[i] == "K" else "K") + value[i + 1 :])
    wrong.append(value.replace(",", ", "))
  out = [body + "\n" + _answer_line(w) for w in wrong]
  # Format violations of a correct value.
  out += [body + "\nAnswer: " + value, p.solution + "\nok", body]
  return out


@pytest.mark.parametrize("name", NAMES)
def test_perturbed_answers_verify_as_wrong(name):
  task = tasks.get(name)
  for d in (1, 3):
    for seed in range(10):
      p = task.generate(seed, d)
      for completion in _perturbations(name, p):
        # A perturbation can be right by accident (countdown has many
        # solutions); re-check those independently before failing.
        if task.verify(completion, p.answer):
          value = base.extract_answer(completion)
          assert name == "countdown" and value is not None, completion
          target, numbers = countdown.parse_spec(p.answer)
          result, used = countdown.evaluate(value)
          assert result == target and sorted(used) == sorted(numbers)


def test_countdown_parser_rejects_hostile_input():
  task = tasks.get("countdown")
  spec = "24:3,8"
  assert task.verify(_answer_line("3*8"), spec) == 1.0
  assert task.verify(_answer_line("8*3"), spec) == 1.0
  for bad in [
    "(" * 1000 + "3*8" + ")" * 1000,
    "__import__('os').system('true')",
    "3**8",
    "3*08",
    "38",
    "3*8*1",
    "-3*-8",
    "3" * 500,
  ]:
    assert task.verify(_answer_line(bad), spec) == 0.0, bad
  assert task.verify(_answer_line("(3*8)"), spec) == 1.0


# --------------------------------------------- independent checks of answers


def _parse_statement(s):
  m = re.fullmatch(r"if (.+) then (.+)", s)
  if m:
    return ("if", _parse_statement(m[1]), _parse_statement(m[2]))
  m = re.fullmatch(r"([A-Z]) same as ([A-Z])", s)
  if m:
    return ("same", m[1], m[2])
  for op in (" and ", " or "):
    if op in s:
      a, b = s.split(op)
      return (op.strip(), _parse_statement(a), _parse_statement(b))
  who, role = s.split()
  assert role in ("knight", "knave")
  return ("is", who, role == "knight")


def _truth(st, roles):
  kind = st[0]
  if kind == "is":
    return roles[st[1]] == st[2]
  if kind == "same":
    return roles[st[1]] == roles[st[2]]
  a, b = _truth(st[1], roles), _truth(st[2], roles)
  return {"and": a and b, "or": a or b, "if": (not a) or b}[kind]


def test_knights_prompt_has_exactly_the_gold_solution():
  task = tasks.get("knights")
  for d in (1, 3, 5):
    for seed in range(20):
      p = task.generate(seed, d)
      lines = [line.split(": ", 1) for line in p.prompt.strip().split("\n")]
      names = [n for n, _ in lines]
      statements = [_parse_statement(s) for _, s in lines]
      found = []
      for values in itertools.product("KN", repeat=len(names)):
        roles = {n: v == "K" for n, v in zip(names, values, strict=True)}
        if all(
          _truth(s, roles) == roles[n]
          for n, s in zip(names, statements, strict=True)
        ):
          found.append(
            ",".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
          )
      assert found == [p.answer], (p.prompt, found)


def test_shortest_path_answer_matches_floyd_warshall():
  task = tasks.get("shortest_path")
  for seed in range(30):
    p = task.generate(seed, 4)
    edges = re.findall(r"([a-z])-([a-z]) (\d+)", p.prompt)
    nodes = sorted({x for u, v, _ in edges for x in (u, v)})
    dist = {(u, v): 0 if u == v else 10**9 for u in nodes for v in nodes}
    for u, v, w in edges:
      dist[u, v] = dist[v, u] = min(dist[u, v], int(w))
    for k, i, j in itertools.product(nodes, repeat=3):
      dist[i, j] = min(dist[i, j], dist[i, k] + dist[k, j])
    target = re.search(r"a to ([a-z])\?", p.prompt)[1]
    assert str(dist["a", target]) == p.answer


def test_arithmetic_answer_matches_independent_evaluation():
  task = tasks.get("arithmetic")
  for d in range(1, 9):
    p = task.generate(d, d)
    value, _ = countdown.evaluate(p.prompt.rstrip("="))
    assert str(value) == p.answer


def test_left_to_right_value_by_hand():
  assert arithmetic.left_to_right_value("3+4*2") == 14
  assert arithmetic.left_to_right_value("2*(3+4)") == 10
  assert arithmetic.left_to_right_value("9-(3-2)") == 4
  assert arithmetic.left_to_right_value("2-5*3") == -9


def test_order_sensitive_problems_are_the_ones_left_to_right_gets_wrong():
  plain, order = tasks.get("arithmetic"), tasks.get("arithmetic_order")
  rng = random.Random(0)
  for d in (1, 2, 3):
    # Plain arithmetic holds both kinds; arithmetic_order only one.
    kinds = {
      _arithmetic_left_to_right(p, rng) == _answer_line(p.answer)
      for p in plain.problems("train", 60, d)
    }
    assert kinds == {True, False}, d
    for split in ("train", "eval"):
      for p in order.problems(split, 30, d):
        assert _arithmetic_left_to_right(p, rng) != _answer_line(p.answer)
        assert plain.split_of(p.prompt) == split
        assert plain.verify(p.solution, p.answer) == 1.0


def test_arithmetic5_draws_operands_1_to_5_and_keeps_the_split():
  small, order = tasks.get("arithmetic5"), tasks.get("arithmetic5_order")
  plain = tasks.get("arithmetic")
  rng = random.Random(0)
  for d in (1, 2, 3, 4):
    seen = set()
    for p in small.problems("train", 40, d):
      operands = [int(x) for x in re.findall(r"\d+", p.prompt)]
      assert len(operands) == d + 2 and set(operands) <= set(range(1, 6))
      seen |= set(operands)
      value, _ = countdown.evaluate(p.prompt.rstrip("="))
      assert str(value) == p.answer
      assert plain.split_of(p.prompt) == "train"
    assert seen == {1, 2, 3, 4, 5}, d
  for p in order.problems("eval", 20, 2):
    assert _arithmetic_left_to_right(p, rng) != _answer_line(p.answer)
    assert plain.split_of(p.prompt) == "eval"
    assert max(int(x) for x in re.findall(r"\d+", p.prompt)) <= 5


def test_plus_first_value_by_hand():
  assert arithmetic.plus_first_value("9-3+2") == 4  # 9-(3+2)
  assert arithmetic.plus_first_value("9-3+2-1") == 3  # 9-(3+2)-1
  assert arithmetic.plus_first_value("5-2+5+2-2") == -6  # 5-(2+5+2)-2
  assert arithmetic.plus_first_value("1+2+3") == 6
  assert arithmetic.plus_first_value("7-2-1") == 4


def test_addsub5_is_flat_plus_minus_and_its_order_problems_need_left_to_right():
  small, order = tasks.get("addsub5"), tasks.get("addsub5_order")
  assert small.max_difficulty == order.max_difficulty == 3
  with pytest.raises(ValueError, match="difficulty"):
    small.generate(0, 4)
  for d in (1, 2, 3):
    for p in small.problems("train", 40, d):
      assert re.fullmatch(r"[1-5]([-+][1-5]){%d}=" % (d + 1), p.prompt)
      value, _ = countdown.evaluate(p.prompt.rstrip("="))  # left to right
      assert str(value) == p.answer
      assert small.verify(p.solution, p.answer) == 1.0
    for split in ("train", "eval"):
      for p in order.problems(split, 20, d, allow_fewer=True):
        expr = p.prompt.rstrip("=")
        assert arithmetic.plus_first_value(expr) != int(p.answer)
        assert small.split_of(p.prompt) == split
        assert "add and subtract from left to right" in p.knowledge
  # Order problems are a real share of level 3, not all of it.
  probs = small.problems("eval", 200, 3)
  share = sum(
    arithmetic.plus_first_value(p.prompt.rstrip("=")) != int(p.answer)
    for p in probs
  ) / len(probs)
  assert 0.5 < share < 0.97, share


# ---------------------------------------- difficulty really changes hardness


def _arithmetic_left_to_right(p, rng):
  # Ignores precedence and parentheses.
  toks = re.findall(r"\d+|[-+*]", p.prompt)
  v = int(toks[0])
  for op, n in zip(toks[1::2], toks[2::2], strict=True):
    v = v + int(n) if op == "+" else v - int(n) if op == "-" else v * int(n)
  return _answer_line(str(v))


def _countdown_random_search(p, rng, budget=20):
  target, numbers = countdown.parse_spec(p.answer)
  for _ in range(budget):
    pool = [str(n) for n in numbers]
    while len(pool) > 1:
      i, j = rng.sample(range(len(pool)), 2)
      e = f"({pool[i]}{rng.choice('+-*/')}{pool[j]})"
      pool = [x for k, x in enumerate(pool) if k not in (i, j)] + [e]
    try:
      if countdown.evaluate(pool[0])[0] == target:
        return _answer_line(pool[0])
    except ZeroDivisionError:
      pass
  return _answer_line("0")


def _knights_guess(p, rng, budget=2):
  # Random role guesses checked against the prompt: the space is 2^people.
  names = [line.split(":")[0] for line in p.prompt.strip().split("\n")]
  statements = [
    _parse_statement(line.split(": ", 1)[1])
    for line in p.prompt.strip().split("\n")
  ]
  for _ in range(budget):
    roles = {n: rng.random() < 0.5 for n in names}
    if all(
      _truth(s, roles) == roles[n]
      for n, s in zip(names, statements, strict=True)
    ):
      break
  return _answer_line(
    ",".join(f"{n}={'K' if roles[n] else 'N'}" for n in names)
  )


def _shortest_path_greedy(p, rng):
  # Walks to the cheapest unvisited neighbour until it reaches the target.
  adj = {}
  for u, v, w in re.findall(r"([a-z])-([a-z]) (\d+)", p.prompt):
    adj.setdefault(u, []).append((int(w), v))
    adj.setdefault(v, []).append((int(w), u))
  target = re.search(r"a to ([a-z])\?", p.prompt)[1]
  node, seen, total = "a", {"a"}, 0
  while node != target:
    options = sorted(x for x in adj[node] if x[1] not in seen)
    if not options:
      return _answer_line("0")
    w, node = options[0]
    seen.add(node)
    total += w
  return _answer_line(str(total))


BASELINES = {
  "arithmetic": (_arithmetic_left_to_right, 5),
  "countdown": (_countdown_random_search, 5),
  "knights": (_knights_guess, 5),
  "shortest_path": (_shortest_path_greedy, 5),
}


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_difficulty_lowers_baseline_accuracy(name):
  task = tasks.get(name)
  solver, max_d = BASELINES[name]
  accuracy = []
  for d in range(1, max_d + 1):
    rng = random.Random(0)
    problems = [task.generate(s, d) for s in range(300)]
    accuracy.append(
      sum(task.verify(solver(p, rng), p.answer) for p in problems) / 300
    )
  assert all(a > b for a, b in zip(accuracy, accuracy[1:], strict=False)), (
    accuracy
  )
  assert accuracy[0] - accuracy[-1] > 0.3, accuracy
