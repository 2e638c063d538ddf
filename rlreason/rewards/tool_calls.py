"""ToolRL's tool-call rewards: format plus graded call matching.

ToolRL (Qian et al. 2025, "ToolRL: Reward is All Tool Learning Needs",
arXiv:2504.13958, Sec. 3.3):

  R = R_format + R_correct,   R_format in {0, 1},  R_correct in [-3, 3]
  R_correct = 6 * S / S_max - 3, where for predicted calls P matched to
  gold calls G:
    S = r_name + sum_j r_param_j + sum_j r_value_j
    r_name  = |names(G) & names(P)| / |names(G) | names(P)|   (Jaccard)
    r_param = |keys(g_j) & keys(p_j)| / |keys(g_j) | keys(p_j)|
    r_value = number of keys k with g_j[k] == p_j[k]
    S_max   = 1 + |G| + sum_j |keys(g_j)|
The pairing of P with G maximises S (the paper matches calls optimally;
here by brute force over permutations, fine for a few calls per turn).

A call is (name, {param: value}). Both functions are host-side numpy.
"""

import itertools
from typing import Sequence

Call = tuple[str, dict]


def _pair_score(g: Call, p: Call) -> float:
  gk, pk = set(g[1]), set(p[1])
  union = gk | pk
  r_param = len(gk & pk) / len(union) if union else 1.0
  r_value = sum(1.0 for k in gk & pk if str(g[1][k]) == str(p[1][k]))
  return r_param + r_value


def correctness(pred: Sequence[Call], gold: Sequence[Call]) -> float:
  """R_correct in [-3, 3] of predicted calls against gold calls."""
  gold, pred = list(gold), list(pred)
  if not gold and not pred:
    return 3.0
  gn, pn = {g[0] for g in gold}, {p[0] for p in pred}
  r_name = len(gn & pn) / len(gn | pn)
  best = 0.0
  slots = pred + [None] * max(0, len(gold) - len(pred))
  for perm in itertools.permutations(slots, len(gold)):
    s = sum(_pair_score(g, p) for g, p in zip(gold, perm) if p is not None)
    best = max(best, s)
  s_max = 1 + len(gold) + sum(len(g[1]) for g in gold)
  return 6.0 * (r_name + best) / s_max - 3.0


def format_ok(turns: Sequence[str], tools: Sequence[str]) -> float:
  """R_format: 1 iff every non-final turn is exactly one tool call line
  (`<tool>: ...`) and the final turn is an `answer: ` line."""
  if not turns:
    return 0.0
  *calls, last = [t.strip() for t in turns]
  ok = all(
    "\n" not in t and any(t.startswith(f"{name}: ") for name in tools)
    for t in calls
  )
  return float(ok and last.startswith("answer: "))
