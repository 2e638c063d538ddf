"""Hints: guidance carried by a prompt, and scoring without it.

Hint-guided RL methods (Guide, arXiv:2506.13923; GHPO, arXiv:2507.10628;
POPE; SEELE, arXiv:2509.06923; KnowRL) show the policy some guidance while
it samples and train it to solve the problem without. A `data.Example`
carries two kinds:

  hint    text shown with the question (knowledge points, a partial
          solution presented as a reference), before the question:
          "<hint>\\n<question>";
  prefix  the start of the response (an oracle solution prefix): the model
          continues it, and the prefix is prompt, not trained completion.

`with_hint` returns the hinted copy; `prompt_text` is what the sampler
sees (context.Context.encode_prompts). Hints are built from what the
procedural tasks supply: `Example.knowledge` (`knowledge_hint`) and
`Example.solution` (`solution_prefix`, or the whole reference solution as
an expert's, `expert_hint`: EGSR, arXiv:2505.08364, shows it and lets the
policy write the solution itself).

Scoring under the hint-free context (Guide's off-policy correction): a
completion o sampled from pi(. | q, h) is re-attached to the hint-free
prompt q (`rebase`, `unhinted_batch`); the loss then computes
log pi_theta(o | q) from batch["tokens"] while batch["old_logp"] keeps the
behaviour log-prob log pi_old(o | q, h), so the PPO ratio is
pi_theta(o | q) / pi_old(o | q, h).
"""

import dataclasses
import math
from typing import Sequence

import numpy as np

from rlreason.model import tokenizer as tokenizer_lib

HINT_PREFIX = "hint: "
EXPERT_PREFIX = "expert: "


def knowledge_hint(points: Sequence[str], k: int | None = None) -> str:
  """The first k knowledge points (all when None) as one hint line.

  knowledge_hint(("a", "b", "c"), 2) == "hint: a; b"; no points -> "".
  """
  points = tuple(points)[: len(points) if k is None else max(k, 0)]
  return HINT_PREFIX + "; ".join(points) if points else ""


def solution_prefix(solution: str, fraction: float) -> str:
  """The first ceil(fraction * lines) lines of a solution, newline ended.

  Whole lines, so a prefix never splits a number; the final answer line is
  never included (a hint must leave something to solve). fraction <= 0
  gives "".

  solution_prefix("a\\nb\\nc\\nanswer: 1", 0.5) == "a\\nb\\n"
  """
  body = _body(solution)
  return "".join(line + "\n" for line in body[: _shown(body, fraction)])


def shown_fraction(solution: str, fraction: float) -> float:
  """The share of the solution's lines before its answer that
  `solution_prefix(solution, fraction)` shows (whole lines round up):
  shown_fraction("a\\nb\\nanswer: 1", 0.05) == 0.5; 0 without such lines."""
  body = _body(solution)
  return _shown(body, fraction) / len(body) if body else 0.0


def _body(solution: str) -> list[str]:
  lines = solution.split("\n")
  return lines[:-1] if len(lines) > 1 else []


def _shown(body: list[str], fraction: float) -> int:
  return min(len(body), math.ceil(max(fraction, 0.0) * len(body) - 1e-9))


def expert_hint(solution: str, instruction: str = "") -> str:
  """A whole reference solution shown as an expert's, one line, with an
  optional instruction on the next line (EGSR's "reformulate it").

  Unlike `solution_prefix` the answer line is included: the policy is shown
  a complete solution and writes its own (a reformulation, sampled by the
  policy), instead of being trained on the expert's tokens.

  expert_hint("a\nb\nanswer: 1") == "expert: a; b; answer: 1"
  expert_hint("a", "redo") == "expert: a\nredo"; no solution -> "".
  """
  lines = [line.strip() for line in solution.split("\n") if line.strip()]
  if not lines:
    return ""
  text = EXPERT_PREFIX + "; ".join(lines)
  return f"{text}\n{instruction}" if instruction else text


def with_hint(
  example, *, hint: str = "", prefix: str = "", hint_after: str = ""
):
  """A copy of `example` that carries `hint`, `prefix` and / or
  `hint_after` (records.Example)."""
  return dataclasses.replace(
    example, hint=hint, prefix=prefix, hint_after=hint_after
  )


def unhinted(example):
  """The hint-free copy of `example`."""
  return with_hint(example)


def is_hinted(example) -> bool:
  return bool(example.hint or example.prefix or example.hint_after)


def prompt_text(tokenizer, example, template: str, *, hinted=True) -> str:
  """The model input of `example`:
  template(hint + question + hint_after) + prefix."""
  question = example.question
  if hinted and example.hint:
    question = f"{example.hint}\n{question}"
  if hinted and example.hint_after:
    question += example.hint_after
  text = tokenizer_lib.apply_template(tokenizer, question, template)
  return text + example.prefix if hinted else text


def rebase(
  tokens: np.ndarray,
  positions: np.ndarray,
  prompt_len: int,
  prompts: Sequence[Sequence[int]],
  pad_id: int,
) -> tuple[np.ndarray, np.ndarray]:
  """Re-attaches completions to other prompts (e.g. the hint-free ones).

  Args:
    tokens: [N, P + T] prompt (left padded to P) then completion.
    positions: [N, P + T]; -1 on padding and after the stop token.
    prompt_len: P.
    prompts: N new prompts (token ids, unpadded).
    pad_id: id of the left padding.

  Returns:
    tokens, positions [N, P' + T], P' = the longest new prompt: prompt i
    left padded, then completion i at positions len(prompt i) + t (-1 where
    it was -1).
  """
  tokens, positions = np.asarray(tokens), np.asarray(positions)
  n, width = tokens.shape
  new_p = max(len(p) for p in prompts)
  out_tok = np.full((n, new_p + width - prompt_len), pad_id, tokens.dtype)
  out_pos = np.full(out_tok.shape, -1, positions.dtype)
  for i, p in enumerate(prompts):
    out_tok[i, new_p - len(p) : new_p] = p
    out_pos[i, new_p - len(p) : new_p] = np.arange(len(p))
  out_tok[:, new_p:] = tokens[:, prompt_len:]
  comp = positions[:, prompt_len:]
  t = np.arange(comp.shape[1])[None, :]
  lens = np.asarray([len(p) for p in prompts])[:, None]
  out_pos[:, new_p:] = np.where(comp >= 0, lens + t, -1)
  return out_tok, out_pos


def unhinted_batch(batch: dict, rollout, examples, ctx) -> dict:
  """`batch` with every completion re-attached to its hint-free prompt.

  batch["old_logp"] (the behaviour log-probs, under the hinted prompt) is
  kept, so the loss's ratio is pi_theta(o | q) / pi_old(o | q, h).
  """
  prompts = ctx.encode_prompts([unhinted(e) for e in examples])
  rows = [prompts[i] for i in rollout.prompt_ids]
  tokens, positions = rebase(
    batch["tokens"],
    batch["positions"],
    rollout.prompt_len,
    rows,
    ctx.tokenizer.pad_id,
  )
  out = dict(batch)
  out["tokens"], out["positions"] = tokens, positions
  return out


def hinted_rows(rollout, examples) -> np.ndarray:
  """[N] bool: the rows sampled from a hinted prompt."""
  flags = np.asarray([is_hinted(e) for e in examples], bool)
  return flags[np.asarray(rollout.prompt_ids)]


# ------------------------------------------------- hint length for a target


def irt_accuracy(ratio, location, *, slope: float, floor: float = 0.0):
  """Item-response curve of accuracy vs hint ratio (SEELE's IRT model):

    p(r) = floor + (1 - floor) * sigmoid(slope * (r - location))

  `location` is the problem's difficulty in hint units: the ratio at which
  accuracy is halfway between floor and 1.
  """
  z = slope * (np.asarray(ratio, np.float64) - location)
  return floor + (1 - floor) / (1 + np.exp(-z))


def fit_irt_location(
  ratios: Sequence[float],
  accuracies: Sequence[float],
  counts: Sequence[float],
  *,
  slope: float,
  floor: float = 0.0,
  bounds: tuple[float, float] = (-2.0, 3.0),
) -> float:
  """Maximum-likelihood location of `irt_accuracy` (slope, floor fixed).

  counts[i] samples at ratios[i] had accuracy accuracies[i]. The score
  sum_i n_i (y_i - p_i) p_i' / (p_i (1 - p_i)) is decreasing in the
  location, so bisection finds its root (clipped to `bounds`). With no
  data, the middle of the bounds.
  """
  r = np.asarray(ratios, np.float64)
  y = np.asarray(accuracies, np.float64)
  n = np.asarray(counts, np.float64)
  lo, hi = bounds
  if not len(r):
    return 0.5 * (lo + hi)

  def score(b):
    p = np.clip(irt_accuracy(r, b, slope=slope, floor=floor), 1e-9, 1 - 1e-9)
    s = (p - floor) / (1 - floor)
    dp = -(1 - floor) * slope * s * (1 - s)  # d p / d location
    return float(np.sum(n * (y - p) * dp / (p * (1 - p))))

  if score(lo) <= 0:
    return lo
  if score(hi) >= 0:
    return hi
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if score(mid) > 0 else (lo, mid)
  return 0.5 * (lo + hi)


def ratio_for_accuracy(
  location: float, target: float, *, slope: float, floor: float = 0.0
) -> float:
  """The hint ratio in [0, 1] where `irt_accuracy` equals `target`."""
  q = (target - floor) / (1 - floor)
  q = min(max(q, 1e-6), 1 - 1e-6)
  return float(np.clip(location + math.log(q / (1 - q)) / slope, 0.0, 1.0))


# ------------------------------------------------------ hinted prompt batches


class HintedPrompts:
  """A prompt iterator whose examples pass through `hint_fn` (e.g. the
  knowledge points selected so far); state() / restore() are the inner
  iterator's, so hints that depend on checkpointed state resume exactly."""

  def __init__(self, inner, hint_fn):
    self.inner, self.hint_fn = inner, hint_fn

  def __iter__(self):
    return self

  def __next__(self):
    return [self.hint_fn(e) for e in next(self.inner)]

  def state(self):
    return self.inner.state()

  def restore(self, state) -> None:
    self.inner.restore(state)


def hinted_iterator(factory, hint_fn):
  """A loop.train(prompt_iterator=...) factory: `factory`'s batches with
  every example passed through hint_fn(example)."""

  def make(cfg, examples):
    return HintedPrompts(factory(cfg, examples), hint_fn)

  return make
