"""Task `calc`: arithmetic that a small model should delegate to a tool.

  Q: Compute 37*48+12.
  calculator: 37*48+12
  output: 1788
  answer: 1788

Operands have 2-3 digits (difficulty 1: a*b+c, 2: a*b+c*d), too large for
the tiny model's mental arithmetic but one `calculator` call away
(envs.base.ToolEnv runs it in the sandbox). `gold_call(prompt)` is the
reference tool call, for ToolRL-style call-matching rewards
(rewards/tool_calls.py).
"""

import re

from rlreason.data import tasks
from rlreason.data.tasks import base as task_base

_EXPR = re.compile(r"Compute (.+)\.")


def gold_call(prompt: str) -> tuple[str, dict]:
  """The reference call of a `calc` prompt: ("calculator", {"expression"})."""
  m = _EXPR.search(prompt)
  return ("calculator", {"expression": m.group(1) if m else ""})


class Calc(task_base.Task):
  name = "calc"
  max_difficulty = 2

  def _generate(self, rng, difficulty):
    n = lambda: rng.randint(11, 199)
    expr = f"{n()}*{n()}+{n()}"
    if difficulty == 2:
      expr += f"*{n()}"
    value = str(eval(expr))  # our own generated digits and operators only
    prompt = f"Q: Compute {expr}.\n"
    call = f"calculator: {expr}\noutput: {value}\n"
    return prompt, value, call + f"answer: {value}", (call,)

  def check(self, value: str, answer: str) -> bool:
    return value == answer


def register_task() -> None:
  """Adds task `calc` to the task registry (idempotent)."""
  if "calc" not in tasks.names():
    tasks.register(Calc())
