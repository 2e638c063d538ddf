"""The text-environment interface, action parsing, and the tool environments.

An episode: `reset(example)` once per rollout row, then `step(action)` after
every turn the policy writes. A turn ends at EOS or at one of the env's
`stop_strings` (default "\\n"; the tool envs add their end tags, e.g.
"</search>", "</answer>"), which multiturn.generate turns into token
sequences checked inside the decode loop (stops.py), multi-token tags
included. `step` returns the observation text that the rollout appends to
the sequence (masked out of the loss), the turn's reward and whether the
episode is over.

Action format (one action per turn; both spellings accepted, so the char
tokenizer and HF chat models can use the same environments):

  <tool>: <argument>            e.g.  search: Ava lives
  <tool>argument</tool>         e.g.  <search>Ava lives</search>
  answer: <value>  |  <answer>value</answer>   ends the episode

A turn with no tool call also ends the episode (Search-R1: a response
without a <search> tag is final). The final reward is `verify(transcript,
gold)` on the whole completion, by default the procedural tasks' strict
`answer: ` line check (tasks.base).
"""

import dataclasses
import re
from typing import Any, Callable, Protocol

from rlreason.envs import sandbox
from rlreason.data.tasks import base as task_base


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What `Env.step` returns.

  Attributes:
    observation: text appended after the action (empty when done).
    reward: this turn's reward (outcome reward on the final turn).
    done: the episode is over.
    info: extra per-turn facts (e.g. {"tool": "search", "status": "ok"}).
  """

  observation: str
  reward: float
  done: bool
  info: dict = dataclasses.field(default_factory=dict)


DEFAULT_STOP_STRINGS = ("\n",)


class Env(Protocol):
  """A text environment: one instance per rollout row.

  Optional attribute `stop_strings` (tuple of str): texts that end a turn
  (`stop_strings(env)` reads it, default DEFAULT_STOP_STRINGS).
  """

  def reset(self, example: Any) -> str:
    """Starts an episode for `example` (question, answer); returns an
    initial observation appended to the prompt ("" for none)."""

  def step(self, action: str) -> StepResult:
    """The policy's turn `action` (decoded text) -> StepResult."""


def stop_strings(env: Any) -> tuple[str, ...]:
  """The texts that end a turn of `env` (its `stop_strings`, else "\\n")."""
  return tuple(getattr(env, "stop_strings", DEFAULT_STOP_STRINGS))


def exact_answer(completion: str, gold: str) -> float:
  """1.0 iff the final `answer: ` line of `completion` equals `gold`."""
  value = task_base.extract_answer(completion)
  if value is None:
    m = re.findall(r"<answer>(.*?)</answer>", completion, re.S)
    value = m[-1].strip() if m else None
  return float(value is not None and value == gold.strip())


def parse_action(text: str, tools: tuple[str, ...]) -> tuple[str, str] | None:
  """The first tool call in a turn: (tool, argument), or None.

  `answer` counts as a tool, so `parse_action(t, ("search", "answer"))`
  returns ("answer", "Rome") for "answer: Rome".
  """
  for tool in tools:
    m = re.search(rf"<{tool}>(.*?)(?:</{tool}>|$)", text, re.S)
    if m:
      return tool, m.group(1).strip()
    m = re.search(rf"(?:^|\n){tool}: ?(.*)", text)
    if m:
      return tool, m.group(1).strip()
  return None


class ToolEnv:
  """Runs `python` or `calculator` tool calls in the sandbox.

  Observation: `output: <stdout or error>\n` (truncated to max_obs_chars).
  Reward: `verify(transcript, gold)` on the final turn, plus
  `tool_reward` per successful tool call (0 by default); a failed call
  (error, timeout, denied) gets `error_reward`.

  A turn ends at `stop_strings`: by default "\\n" (the `tool: arg` line
  format) and the end tags `</tool>`, `</answer>`. Models that write
  multi-line turns (chat models that think first, Search-R1's format) pass
  stop_strings=("</tool>", "</answer>") so that only the tags end a turn.
  """

  def __init__(
    self,
    *,
    tool: str = "python",
    verify: Callable[[str, str], float] = exact_answer,
    tool_reward: float = 0.0,
    error_reward: float = 0.0,
    timeout_s: float = 2.0,
    memory_mb: int = 256,
    max_obs_chars: int = 64,
    stop_strings: tuple[str, ...] | None = None,
  ):
    if tool not in ("python", "calculator"):
      raise ValueError(f"tool={tool!r}: expected 'python' or 'calculator'")
    self.tool, self.verify = tool, verify
    self.tool_reward, self.error_reward = tool_reward, error_reward
    self.timeout_s, self.memory_mb = timeout_s, memory_mb
    self.max_obs_chars = max_obs_chars
    self._stop_strings = stop_strings
    self.gold, self.transcript = "", ""

  @property
  def stop_strings(self) -> tuple[str, ...]:
    if self._stop_strings is not None:
      return tuple(self._stop_strings)
    return ("\n", f"</{self.tool}>", "</answer>")

  def reset(self, example) -> str:
    self.gold, self.transcript = example.answer, ""
    return ""

  def run_tool(self, arg: str) -> sandbox.Result:
    code = arg if self.tool == "python" else f"print({arg})"
    return sandbox.run_python(
      code, timeout_s=self.timeout_s, memory_mb=self.memory_mb
    )

  def step(self, action: str) -> StepResult:
    self.transcript += action
    call = parse_action(action, (self.tool, "answer"))
    if call is None or call[0] == "answer":
      reward = self.verify(self.transcript, self.gold)
      return StepResult("", reward, True, {"tool": None})
    res = self.run_tool(call[1])
    if res.status == "ok":
      text, reward = res.stdout.strip(), self.tool_reward
    else:
      last = res.stderr.strip().splitlines()[-1:] or [res.status]
      text, reward = f"{res.status}: {last[0]}", self.error_reward
    text = text.replace("\n", " ")[: self.max_obs_chars]
    obs = ("" if action.endswith("\n") else "\n") + f"output: {text}\n"
    self.transcript += obs
    return StepResult(
      obs, reward, False, {"tool": self.tool, "status": res.status}
    )
