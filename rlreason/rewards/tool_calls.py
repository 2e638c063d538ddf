"""ToolRL's tool-call rewards: format plus graded call matching.

ToolRL (Qian et al. 2025, "ToolRL: Reward is All Tool Learning Needs",
arXiv:2504.13958, Sec. 3.3), as the authors' rlla.py computes it
(compute_tool_call_reward, match_score; as their forks carry it):

  R = R_format + R_correct,   R_format in {0, 1},  R_correct in [-3, 3]
  R_correct = 6 * S / S_max - 3 (3 when the calls equal the gold ones),
    S     = r_name + sum_j (r_param_j + r_value_j)
    r_name  = match(names(G), names(P))
    r_param = match(keys(g_j), keys(p_j))
    r_value = number of keys k with g_j[k] == p_j[k]
    S_max   = 1 + |G| + sum_j |keys(g_j)|
  with match(a, b) the multiset overlap |a & b| / (|a| + |b| - |a & b|)
  (1 for equal lists, 0 if either is empty), so a repeated or extra call
  lowers r_name. Each gold call g_j in turn takes the unused predicted
  call OF THE SAME NAME with the largest r_param + r_value (greedy, the
  first on ties); a predicted call of another name scores nothing. No
  gold call: R_correct 0.

A call is (name, {param: value}). Both functions are host-side numpy.
"""

import collections
from typing import Sequence

Call = tuple[str, dict]


def match(a: Sequence, b: Sequence) -> float:
  """Multiset overlap of two lists (the authors' match_score)."""
  a, b = list(a), list(b)
  if a == b:
    return 1.0
  if not a or not b:
    return 0.0
  ca, cb = collections.Counter(a), collections.Counter(b)
  common = sum(min(ca[k], cb[k]) for k in ca.keys() & cb.keys())
  return common / (len(a) + len(b) - common)


def correctness(pred: Sequence[Call], gold: Sequence[Call]) -> float:
  """R_correct in [-3, 3] of predicted calls against gold calls."""
  gold, pred = list(gold), list(pred)
  if not gold:
    return 0.0
  if pred == gold:
    return 3.0
  score = match([g[0] for g in gold], [p[0] for p in pred])
  used = set()
  for name, params in gold:
    best, best_i = 0.0, -1
    for i, (p_name, p_params) in enumerate(pred):
      if i in used or p_name != name:
        continue
      s = match(list(params), list(p_params)) + sum(
        1.0 for k, v in params.items() if k in p_params and p_params[k] == v
      )
      if s > best:
        best, best_i = s, i
    if best_i >= 0:
      used.add(best_i)
      score += best
  s_max = 1 + sum(1 + len(g[1]) for g in gold)
  return 6.0 * score / s_max - 3.0


def format_ok(
  turns: Sequence[str], tools: Sequence[str], *, needs_call: bool = True
) -> float:
  """R_format: 1 iff every non-final turn is exactly one tool call line
  (`<tool>: ...`), the final turn is an `answer: ` line and, with
  `needs_call` (the gold answer has a call: the authors' pattern then
  requires one), at least one call came before it."""
  if not turns:
    return 0.0
  *calls, last = [t.strip() for t in turns]
  ok = all(
    "\n" not in t and any(t.startswith(f"{name}: ") for name in tools)
    for t in calls
  )
  ok = ok and (bool(calls) or not needs_call)
  return float(ok and last.startswith("answer: "))
