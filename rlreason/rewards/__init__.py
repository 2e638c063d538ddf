"""Reward functions (host side, numpy) and their registry.

Every reward has the signature

    fn(completions: Sequence[str], answers: Sequence[str] | None, **kwargs)
        -> float32 [N]

where extra inputs (token lengths, entropies, group size, ...) are explicit
keyword arguments. Names:

  correctness  math, exact_match, task:<task name> (task:arithmetic, ...)
  format       format (= format_strict), format_strict, format_soft,
               answer_line, logic_rl (format + answer, Logic-RL)
  length       overlong (DAPO), truncation (DLER), laser (LASER), token_budget
  label-free   majority_vote (TTRL), neg_entropy (RENT), self_certainty,
               format_length (Format-Length surrogate), semantic_cluster
               (EMPO); rewards.likelihood holds RLPR's reference-answer
               probability reward (it needs policy scores, see
               self_scoring.py)

    fn = rewards.get("overlong", max_length=4096, buffer_length=512)
    total_fn = rewards.combine({"math": 1.0, "format": 0.1})
    total, parts = total_fn(completions, answers)   # [N], {name: [N]}

Layer 5, rewards: imports data/, rl/, sampling/, model/ and the bottom
modules.
"""

import functools
import inspect
from typing import Any, Callable, Mapping

import numpy as np

from rlreason.rewards import format as format_lib
from rlreason.rewards import label_free
from rlreason.rewards import length
from rlreason.rewards import math as math_lib
from rlreason.rewards import semantic
from rlreason.rewards import verifiers

RewardFn = Callable[..., np.ndarray]

_REGISTRY: dict[str, RewardFn] = {
  "math": math_lib.math_reward,
  "exact_match": verifiers.exact_match,
  "format": format_lib.format_strict,
  "format_strict": format_lib.format_strict,
  "format_soft": format_lib.format_soft,
  "answer_line": format_lib.answer_line,
  "logic_rl": format_lib.logic_rl,
  "overlong": length.overlong,
  "truncation": length.truncation,
  "laser": length.laser,
  "token_budget": length.token_budget,
  "majority_vote": label_free.majority_vote,
  "neg_entropy": label_free.neg_entropy,
  "self_certainty": label_free.self_certainty,
  "format_length": label_free.format_length,
  "semantic_cluster": semantic.semantic_cluster_reward,
}
_TASK_PREFIX = "task:"


def register(name: str, fn: RewardFn) -> RewardFn:
  """Adds a reward under `name` (e.g. from an experiment file)."""
  if name in _REGISTRY or name.startswith(_TASK_PREFIX):
    raise ValueError(f"reward {name!r} is already registered or reserved")
  _REGISTRY[name] = fn
  return fn


def names() -> list[str]:
  from rlreason.data import tasks

  return sorted(_REGISTRY) + [_TASK_PREFIX + t for t in tasks.names()]


def _params(fn) -> tuple[set[str], bool]:
  """(keyword parameter names, whether fn takes **kwargs)."""
  sig = inspect.signature(fn)
  var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
  return set(sig.parameters), var_kw


def get(name: str, **bound: Any) -> RewardFn:
  """The reward called `name`, with keyword arguments optionally bound.

  Raises:
    KeyError: unknown name.
    TypeError: a bound argument the reward does not take.
  """
  if name.startswith(_TASK_PREFIX):
    fn = verifiers.make_task_reward(name[len(_TASK_PREFIX) :])
  elif name in _REGISTRY:
    fn = _REGISTRY[name]
  else:
    raise KeyError(f"unknown reward {name!r}; known: {names()}")
  if not bound:
    return fn
  params, var_kw = _params(fn)
  unknown = set(bound) - params
  if unknown and not var_kw:
    raise TypeError(f"reward {name!r} takes no argument(s) {sorted(unknown)}")
  return functools.partial(fn, **bound)


def combine(
  weights: Mapping[str, float],
  *,
  params: Mapping[str, Mapping[str, Any]] | None = None,
  fns: Mapping[str, RewardFn] | None = None,
  correct_from: str | None = None,
) -> Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]]:
  """A weighted sum of rewards that also returns every component.

      total_i = sum_k weights[k] * component_k(completions, answers)_i

  Call-time keyword arguments go to the components whose signature names
  them (e.g. `lengths=` reaches `overlong` but not `math`); an argument that
  no component takes raises TypeError. A component with weight 0 is still
  computed and reported (useful as a metric or as `correct_from`).

  Args:
    weights: component name -> weight; names are registry names or keys of
      `fns`.
    params: component name -> keyword arguments bound at construction
      (`{"overlong": {"max_length": 4096, "buffer_length": 512}}`).
    fns: component name -> reward function, for unregistered rewards.
    correct_from: a component whose (unweighted) output is passed as
      `correct=` to components that take it (truncation, laser), unless the
      caller passes `correct` explicitly. It is computed first.

  Returns:
    fn(completions, answers=None, **kwargs) -> (total float32 [N],
      {name: float32 [N]}).
  """
  params, fns = dict(params or {}), dict(fns or {})
  components = {}
  for name in weights:
    if name in fns:
      fn = fns[name]
      if name in params:
        fn = functools.partial(fn, **params[name])
    else:
      fn = get(name, **params.get(name, {}))
    components[name] = (fn, *_params(fn))
  if correct_from is not None and correct_from not in weights:
    raise ValueError(f"correct_from={correct_from!r} is not a component")
  order = sorted(weights, key=lambda k: k != correct_from)

  def combined(completions, answers=None, **kwargs):
    n = len(completions)
    parts, used = {}, set()
    for name in order:
      fn, accepted, var_kw = components[name]
      kw = {k: v for k, v in kwargs.items() if var_kw or k in accepted}
      if "correct" in accepted and "correct" not in kw and correct_from:
        kw["correct"] = parts[correct_from]
      used.update(kw)
      out = np.asarray(fn(completions, answers, **kw), np.float32)
      if out.shape != (n,):
        raise ValueError(f"reward {name!r} returned {out.shape}, not [{n}]")
      parts[name] = out
    unused = set(kwargs) - used
    if unused:
      raise TypeError(f"no reward component takes {sorted(unused)}")
    total = np.zeros(n, np.float32)
    for name, w in weights.items():
      total += np.float32(w) * parts[name]
    return total, {name: parts[name] for name in weights}

  return combined
