r"""Math answer reward: extraction + Math-Verify (sympy) in a process pool.

reward_i = 1 if the final answer of completion i is mathematically equivalent
to the gold answer i under Math-Verify (huggingface/Math-Verify), else 0.

The prediction is the last `<answer>` tag / `\boxed{}` / `Answer:` line (see
`rewards.extract`). Both sides are wrapped in `\boxed{...}` and parsed with
Math-Verify's default extraction (LaTeX + plain expressions), then compared
with `verify(gold, pred)` (argument order matters: gold first). Documented
Math-Verify behaviours worth knowing (tests pin them):
  * floats are compared after rounding to 6 decimals (`float_rounding=6`),
    so 0.3333333 matches 1/3 while 0.333 does not;
  * a percentage matches both its value and its number (50% ~ 0.5 ~ 50);
  * `x=2` matches `2` (assignments are unwrapped), units and `\text{}` are
    dropped, single letters match case-insensitively (multiple choice).

Safety: extraction runs on the host in linear time; the extracted answer is
pre-filtered (length and bracket-nesting caps, `REJECTED` status) and only
then sent to the pool, where a per-item timeout kills a stuck worker
(`pool.TIMEOUT`). Nothing is ever eval()'d.
"""

import logging
import threading
from typing import Sequence

import numpy as np

from rlreason.data import extract
from rlreason.rewards import pool as pool_lib

MAX_ANSWER_CHARS = 256  # Math-Verify needs seconds for a 5k-char string.
MAX_NESTING = 10  # ...and hangs on 50 nested braces.

_default_pool = None
_default_lock = threading.Lock()


def warmup():
  """Imports Math-Verify and compiles its parsers once (in a worker)."""
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  equivalent("1/2", "\\frac{1}{2}")


def _boxed(s: str) -> str:
  s = s.strip()
  for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
    if len(s) > len(left + right) and s.startswith(left) and s.endswith(right):
      s = s[len(left) : -len(right)].strip()
      break
  return "\\boxed{" + s + "}"


def equivalent(pred: str, gold: str) -> float:
  """1.0 iff Math-Verify finds `pred` equivalent to `gold` (no timeout!).

  Runs without Math-Verify's signal-based timeouts: call it through a
  `VerifierPool`, which enforces the time limit from outside.
  """
  from math_verify import parse
  from math_verify import verify

  gold_parsed = parse(_boxed(gold), parsing_timeout=None)
  pred_parsed = parse(_boxed(pred), parsing_timeout=None)
  if not gold_parsed or not pred_parsed:
    return 0.0
  return float(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def make_pool(
  num_workers: int | None = None, timeout: float = 5.0, **kwargs
) -> pool_lib.VerifierPool:
  """A VerifierPool whose workers have Math-Verify warmed up."""
  return pool_lib.VerifierPool(
    num_workers=num_workers, timeout=timeout, warmup=warmup, **kwargs
  )


def default_pool() -> pool_lib.VerifierPool:
  """The process-wide pool, created on first use and closed at exit."""
  global _default_pool
  with _default_lock:
    if _default_pool is None or _default_pool._closed:
      _default_pool = make_pool()
    return _default_pool


def prefilter(answer: str) -> bool:
  """Whether an extracted answer is safe to hand to Math-Verify."""
  return len(answer) <= MAX_ANSWER_CHARS and (
    extract.nesting_depth(answer) <= MAX_NESTING
  )


def verify_batch(
  completions: Sequence[str],
  answers: Sequence[str],
  *,
  pool: pool_lib.VerifierPool | None = None,
  timeout: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Scores completions against gold answers; also returns per-item status.

  Args:
    completions: N decoded completions.
    answers: N gold answers (LaTeX or plain; no `$` needed).
    pool: the VerifierPool to use (default: `default_pool()`).
    timeout: per-item seconds (default: the pool's).

  Returns:
    (rewards float32 [N], status int8 [N]) with `rewards.pool` status codes.
    A completion without an extractable answer scores 0 with status OK.
  """
  if len(completions) != len(answers):
    raise ValueError(f"{len(completions)} completions, {len(answers)} answers")
  rewards = np.zeros(len(completions), np.float32)
  status = np.full(len(completions), pool_lib.OK, np.int8)
  jobs, where = [], []
  for i, (completion, gold) in enumerate(
    zip(completions, answers, strict=True)
  ):
    pred = extract.extract(completion)
    if pred is None:
      continue
    pred = pred.strip().rstrip(".").strip()
    if not pred:
      continue
    if not prefilter(pred):
      status[i] = pool_lib.REJECTED
      continue
    if extract.normalize(pred) == extract.normalize(gold):
      rewards[i] = 1.0  # Fast path: no need to start sympy.
      continue
    jobs.append((pred, str(gold)))
    where.append(i)
  if jobs:
    pool = pool or default_pool()
    values, codes = pool.map(equivalent, jobs, timeout=timeout)
    rewards[where], status[where] = values, codes
  pool = pool or _default_pool
  if pool is not None:
    pool.counts["rejected"] += int((status == pool_lib.REJECTED).sum())
  return rewards, status


def math_reward(
  completions: Sequence[str],
  answers: Sequence[str],
  *,
  pool: pool_lib.VerifierPool | None = None,
  timeout: float | None = None,
) -> np.ndarray:
  """float32 [N]: 1 where the final answer is equivalent to the gold one."""
  return verify_batch(completions, answers, pool=pool, timeout=timeout)[0]
