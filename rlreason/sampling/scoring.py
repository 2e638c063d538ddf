"""Evaluation metrics over n samples per problem: pass@k, maj@k, mean@k.

Scores are per problem, then averaged over problems with a 95% confidence
interval (normal approximation over problems; Wilson for 0/1 accuracies).

  pass@k  unbiased estimator of P(at least one of k samples is correct) from
          n >= k samples with c correct (Chen et al. 2021, arXiv:2107.03374,
          Eq. 1): 1 - C(n - c, k) / C(n, k).
  maj@k   the majority answer among the first k samples is correct. Ties go
          to the answer seen first; unparsed answers (None) do not vote.
  mean@k  mean correctness of the first k samples (avg@k in some papers).

`sample_and_score` generates and verifies the samples these metrics read
(greedy, or n per problem at a temperature) with a fixed key, so every
evaluation of the same params sees the same randomness.
"""

import collections
import dataclasses
import json
import math
import os
import sys
from typing import Callable, Hashable, Sequence

import jax
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.sampling import draw as sampling_lib
from rlreason.sampling import journal as journal_lib

# Offset of the evaluation key from the run's seed: evaluation randomness is
# fixed and differs from the training rollouts'.
EVAL_SEED_OFFSET = 10_007


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k for one problem with n samples, c of them correct."""
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  # 1 - prod_{i=n-c+1}^{n} (1 - k / i): the binomial ratio without overflow.
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority(answers: Sequence[Hashable | None]) -> Hashable | None:
  """Most frequent non-None answer; ties go to the one that appears first."""
  counts = collections.Counter(a for a in answers if a is not None)
  if not counts:
    return None
  best = max(counts.values())
  return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(
  answers: Sequence[Hashable | None], correct: Sequence[bool], k: int
) -> float:
  """1.0 if the majority answer of the first k samples is a correct one."""
  if len(answers) != len(correct):
    raise ValueError("maj_at_k: answers and correct differ in length")
  if not 1 <= k <= len(answers):
    raise ValueError(f"maj_at_k: need 1 <= k <= {len(answers)}, got {k}")
  vote = majority(answers[:k])
  if vote is None:
    return 0.0
  return float(any(c for a, c in zip(answers[:k], correct[:k]) if a == vote))


def mean_at_k(correct: Sequence[float], k: int) -> float:
  if not 1 <= k <= len(correct):
    raise ValueError(f"mean_at_k: need 1 <= k <= {len(correct)}, got {k}")
  return float(np.mean(np.asarray(correct[:k], np.float64)))


def mean_ci(values: Sequence[float], z: float = 1.96):
  """(mean, low, high): normal-approximation interval over problems.

  For 0/1 values the Wilson score interval is used (sensible at 0 and 1).
  """
  v = np.asarray(values, np.float64)
  n = v.size
  if n == 0:
    return float("nan"), float("nan"), float("nan")
  m = float(v.mean())
  if np.isin(v, (0.0, 1.0)).all():
    denom = 1 + z * z / n
    centre = (m + z * z / (2 * n)) / denom
    half = z * math.sqrt(m * (1 - m) / n + z * z / (4 * n * n)) / denom
    return m, centre - half, centre + half
  se = float(v.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
  return m, m - z * se, m + z * se


def summarize(
  correct: np.ndarray,
  answers: Sequence[Sequence] | None = None,
  ks: Sequence[int] = (1,),
) -> dict[str, tuple[float, float, float]]:
  """Per-metric (mean, low, high) over problems.

  Args:
    correct: [B, n] 0/1 correctness of n samples for each of B problems.
    answers: B lists of n extracted answers (for maj@k); None skips maj@k.
    ks: the k values to report (each <= n).
  """
  correct = np.asarray(correct, np.float64)
  b, n = correct.shape
  out = {}
  for k in ks:
    if k > n:
      continue
    out[f"pass@{k}"] = mean_ci([pass_at_k(n, int(c.sum()), k) for c in correct])
    out[f"mean@{k}"] = mean_ci([mean_at_k(c, k) for c in correct])
    if answers is not None:
      out[f"maj@{k}"] = mean_ci(
        [maj_at_k(a, c, k) for a, c in zip(answers, correct)]
      )
  return out


def markdown_table(
  rows: dict[str, dict[str, tuple[float, float, float]]],
) -> str:
  """{row name: summarize(...)} -> a markdown table of mean [low, high]."""
  metrics = sorted(
    {m for r in rows.values() for m in r},
    key=lambda m: (m.split("@")[0], int(m.split("@")[1])),
  )
  lines = ["| | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
  for name, r in rows.items():
    cells = [
      f"{100 * r[m][0]:.1f} [{100 * r[m][1]:.1f}, {100 * r[m][2]:.1f}]"
      if m in r
      else ""
      for m in metrics
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Scored:
  """n completions for each of B problems and their verdicts.

  Attributes:
    texts: B lists of n completion strings.
    correct: [B, n] 0/1 correctness from the verifier.
    answers: B lists of n extracted answers (None: unparsed), for maj@k;
      None when no extractor was given.
  """

  texts: list[list[str]]
  correct: np.ndarray
  answers: list[list[Hashable | None]] | None = None


def journal_path(directory: str, name: str, setting: dict) -> str:
  """<directory>/<name>-<digest>.jsonl: a sample_and_score journal named
  by everything its samples depend on (`setting`, JSON-able or repr'd), so
  a changed setting never resumes another's. Process 0, its only reader
  and writer, makes the directory."""
  if jax.process_index() == 0:
    os.makedirs(directory, exist_ok=True)
  digest = journal_lib.setting_digest(setting)
  return os.path.join(directory, f"{name}-{digest}.jsonl")


def _read_journal(path: str | None, problems: int):
  """(texts, correct) of the problems a journal holds, in order. A torn
  last line (the process died mid-write) is dropped from the file too,
  before the caller appends to it. Process 0 alone reads and writes it;
  the others get its rows (mesh.from_process_0), so every process of a
  multi-host evaluation starts after the same problems."""
  rows = []
  if path and jax.process_index() == 0 and os.path.exists(path):
    rows = metrics_lib.read_jsonl(path)
    if len(rows) <= problems:
      with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
  if path:
    rows = mesh_lib.from_process_0(rows)
  if len(rows) > problems:
    raise ValueError(
      f"{path} holds {len(rows)} problems, more than the {problems} "
      "evaluated: another evaluation's journal"
    )
  return [r["texts"] for r in rows], [r["correct"] for r in rows]


def sample_and_score(
  ctx,
  params,
  examples,
  *,
  step: int,
  samples: int = 1,
  temperature: float = 1.0,
  seed: int = 0,
  sequences_per_call: int = 128,
  extract_fn: Callable[[str], Hashable | None] | None = None,
  progress_every: float = 30.0,
  journal: str | None = None,
) -> Scored:
  """Greedy (samples=1) or `samples` sampled completions per problem.

  Args:
    ctx: a context.Context (its `generate` and `correct_fn` are used).
    params: the policy.
    examples: B data.Examples; gold answers come from `.answer`.
    step: folded into the sampling key (as in the training rollouts).
    samples: n completions per problem; 1 decodes greedily.
    temperature: sampling temperature when samples > 1.
    seed: the run's seed; the key is seed + EVAL_SEED_OFFSET.
    sequences_per_call: prompts go through `ctx.generate` in chunks of
      sequences_per_call // samples (at least 1). Each chunk passes the
      index of its first row (row_offset), so the samples do not depend on
      the chunk size: variants of a run with other batch shapes evaluate
      one checkpoint alike.
    extract_fn: completion -> hashable answer (None when unparsed), for
      maj@k; None skips extraction.
    progress_every: an evaluation that runs longer prints a progress line
      (problems done, ETA) at most this often, in seconds: after a chunk,
      and within one from the sampler's reports (Context.generate's
      progress).
    journal: a .jsonl file that keeps each problem's completions and
      scores as its chunk finishes. A call given a journal that holds the
      first problems starts after them (its samples do not depend on where
      chunks fall: row_offset), so an interrupted evaluation loses at most
      one chunk. The caller keeps one journal per evaluation setting; with
      several processes, process 0's is the one (every process passes
      the same path; the others neither read nor write it).
      ctx.interrupt (where set) is called after each chunk but the last,
      and within one between its sampler calls: it may raise to stop the
      evaluation there, resumed from the journal by the next call.
  """
  if not examples:
    raise ValueError("sample_and_score: no examples to evaluate")
  sampling = sampling_lib.Sampling(
    temperature=0.0 if samples == 1 else temperature
  )
  rng = jax.random.key(seed + EVAL_SEED_OFFSET)
  per_call = max(1, sequences_per_call // samples)
  texts, correct = _read_journal(journal, len(examples))
  start, is_main = len(texts), jax.process_index() == 0
  if start and is_main:
    print(
      f"eval: {start} of {len(examples)} problems from {journal}",
      file=sys.stderr,
      flush=True,
    )
  # 0/1 float32, as correct_fn scores them.
  correct = [np.float32(correct).reshape(start, samples)] if start else []
  progress = metrics_lib.Progress(
    len(examples), start, label="eval problems", every=progress_every
  )

  def within(lo):
    """A long chunk's sampler reports the rows it has sampled: problems
    done so far (every process passes it, as the loop's; process 0
    prints)."""

    def report(rows):
      if is_main:
        progress.maybe(lo + rows // samples)

    return report

  for lo in range(start, len(examples), per_call):
    chunk = examples[lo : lo + per_call]
    r = ctx.generate(
      params,
      chunk,
      rng,
      step,
      group_size=samples,
      sampling=sampling,
      max_new_tokens=getattr(ctx.cfg, "eval_max_new_tokens", 0) or None,
      row_offset=lo * samples,
      progress=within(lo),
    )
    gold = [chunk[i].answer for i in r.prompt_ids]
    # Completions are prompt-major: prompt i owns rows i*n .. (i+1)*n - 1.
    correct.append(
      np.asarray(ctx.correct_fn(r.texts, gold)).reshape(len(chunk), samples)
    )
    new = [
      list(r.texts[i * samples : (i + 1) * samples]) for i in range(len(chunk))
    ]
    texts += new
    if journal and is_main:
      with open(journal, "a") as f:
        for row, c in zip(new, correct[-1]):
          f.write(json.dumps({"texts": row, "correct": c.tolist()}) + "\n")
    done = lo + len(chunk)
    if done < len(examples):
      if is_main:
        progress.maybe(done, {"accuracy": np.concatenate(correct).mean()})
      if getattr(ctx, "interrupt", None) is not None:
        ctx.interrupt()  # after the journal holds the chunk
  answers = None
  if extract_fn is not None:
    answers = [[extract_fn(t) for t in row] for row in texts]
  return Scored(texts, np.concatenate(correct), answers)
