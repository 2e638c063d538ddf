"""What a base model can do before RL: the measurements of its base card.

  rows = base_card.measure(params, model_cfg, tok, levels={"arithmetic": 4})
  print(base_card.table(rows))

For every (task, difficulty) on held-out problems, at temperature 1 with n
samples per problem: pass@1 (the mean accuracy of a sample), pass@n (some
sample right), maj@n (the most common answer right), greedy accuracy, the
median and 90th-percentile response length in tokens (EOS included), the
mean token entropy (nats; the Monte-Carlo estimate E[-log p(sampled
token)], exact in expectation at temperature 1) and pass@1 with every
knowledge point of the problem shown as a hint (`hints.knowledge_hint`, the
format Guide and KnowRL use).
"""

import dataclasses

import jax
import numpy as np

from rlreason.data import sources
from rlreason.data import tasks
from rlreason.guidance import hints as hints_lib
from rlreason.sampling import draw
from rlreason.sampling import rollout as rollout_lib
from rlreason.sampling import scoring


@dataclasses.dataclass(frozen=True)
class Row:
  task: str
  difficulty: int
  problems: int
  pass1: float
  pass_n: float
  maj_n: float
  greedy: float
  median_len: float
  p90_len: float
  entropy: float
  hinted_pass1: float
  lengths: tuple = dataclasses.field(default=(), repr=False)


def _sample(
  params, model_cfg, tok, prompts, *, samples, temperature, max_new_tokens, seed
):
  return rollout_lib.generate(
    params,
    prompts,
    jax.random.key(seed),
    0,
    model_cfg=model_cfg,
    tokenizer=tok,
    max_new_tokens=max_new_tokens,
    group_size=samples,
    sampling=draw.Sampling(temperature=temperature),
    rows_per_call=512,
    batching="continuous",
  )


def _prompts(tok, problems, hinted: bool, prefix: str = ""):
  """Token ids of each problem's prompt (with its knowledge hint when
  `hinted`), followed by `prefix`, the start of the solution, if any."""
  out = []
  for p in problems:
    hint = hints_lib.knowledge_hint(p.knowledge) if hinted else ""
    example = sources.Example(
      uid=p.uid, question=p.prompt, answer=p.answer, hint=hint, prefix=prefix
    )
    out.append(tok.encode(hints_lib.prompt_text(tok, example, "plain")))
  return out


def _right(task, texts, problems) -> np.ndarray:
  """[problems, samples] 0/1: whether each sample verifies."""
  per = len(texts) // len(problems)
  return np.asarray(
    [task.verify(t, problems[k // per].answer) for k, t in enumerate(texts)]
  ).reshape(len(problems), per)


def measure(
  params,
  model_cfg,
  tok,
  levels: dict[str, int],
  *,
  problems: int = 64,
  samples: int = 16,
  max_new_tokens: int = 256,
  seed: int = 0,
  progress=print,
) -> list[Row]:
  """One Row per (task, difficulty 1..levels[task]) on eval-split problems."""
  rows = []
  for name, top in levels.items():
    task = tasks.get(name)
    for d in range(1, top + 1):
      # A small level's eval split may hold fewer (the row counts them).
      probs = task.problems("eval", problems, d, seed, allow_fewer=True)
      kw = dict(max_new_tokens=max_new_tokens, seed=seed)
      plain = _prompts(tok, probs, hinted=False)
      out = _sample(
        params, model_cfg, tok, plain, samples=samples, temperature=1.0, **kw
      )
      hinted = _sample(
        params,
        model_cfg,
        tok,
        _prompts(tok, probs, True),
        samples=samples,
        temperature=1.0,
        **kw,
      )
      greedy = _sample(
        params, model_cfg, tok, plain, samples=1, temperature=0.0, **kw
      )
      right = _right(task, out.texts, probs)
      answers = [tasks.extract_answer(t) for t in out.texts]
      maj = [
        scoring.maj_at_k(answers[k * samples : (k + 1) * samples], r, samples)
        for k, r in enumerate(right)
      ]
      mask = np.asarray(out.mask, np.float64)
      logp = np.asarray(out.policy_logp, np.float64)
      lengths = np.asarray(out.lengths)
      rows.append(
        Row(
          task=name,
          difficulty=d,
          problems=len(probs),
          pass1=float(right.mean()),
          pass_n=float(right.max(1).mean()),
          maj_n=float(np.mean(maj)),
          greedy=float(_right(task, greedy.texts, probs).mean()),
          median_len=float(np.median(lengths)),
          p90_len=float(np.percentile(lengths, 90)),
          entropy=float(-(logp * mask).sum() / mask.sum()),
          hinted_pass1=float(_right(task, hinted.texts, probs).mean()),
          lengths=tuple(int(x) for x in lengths),
        )
      )
      if progress:
        progress(f"base card: {name} level {d}: " + _cells(rows[-1], samples))
  return rows


def _cells(r: Row, samples: int) -> str:
  n = samples
  return (
    f"pass@1 {r.pass1:.1%}, pass@{n} {r.pass_n:.1%}, maj@{n} {r.maj_n:.1%}, "
    f"greedy {r.greedy:.1%}, length {r.median_len:.0f} / {r.p90_len:.0f}, "
    f"entropy {r.entropy:.3f}, hinted {r.hinted_pass1:.1%}"
  )


def table(rows: list[Row], samples: int = 16) -> str:
  """The rows as a markdown table."""
  n = samples
  cols = (
    "task",
    "level",
    "problems",
    "pass@1",
    f"pass@{n}",
    f"pass@{n} / pass@1",
    f"maj@{n}",
    "greedy",
    "median length",
    "p90 length",
    "entropy (nats/token)",
    "pass@1 with hint",
    "hint gain",
  )
  lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
  for r in rows:
    cells = (
      r.task,
      r.difficulty,
      r.problems,
      f"{r.pass1:.1%}",
      f"{r.pass_n:.1%}",
      f"{r.pass_n / r.pass1:.1f}x" if r.pass1 else "-",
      f"{r.maj_n:.1%}",
      f"{r.greedy:.1%}",
      f"{r.median_len:.0f}",
      f"{r.p90_len:.0f}",
      f"{r.entropy:.3f}",
      f"{r.hinted_pass1:.1%}",
      f"{100 * (r.hinted_pass1 - r.pass1):+.1f} pts",
    )
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
  return "\n".join(lines) + "\n"


def pooled_lengths(rows: list[Row]) -> tuple[float, float]:
  """Median and 90th percentile of every sampled response's length."""
  lengths = np.concatenate([np.asarray(r.lengths) for r in rows])
  return float(np.median(lengths)), float(np.percentile(lengths, 90))
