"""Score a policy on a task or dataset; write the table.

  policy = trained.load("workdirs/grpo")
  report = evaluate.evaluate(policy, data="task:arithmetic:difficulty=2",
                             samples=8, ks=(1, 4, 8))
  print(report.table())
  evaluate.write(report, "out/")   # eval.md, eval.json, samples.jsonl

Greedy accuracy, and with samples > 1 pass@k / maj@k / mean@k with 95%
intervals (rlreason/sampling/scoring.py). Sampling, chunking and the key match
context.run_eval, so a workdir scores as the loop scored it.
"""

import dataclasses
import json
import os
from typing import Sequence

import numpy as np
from etils import epath

from rlreason import storage
from rlreason.data import sources as data_lib
from rlreason.sampling import scoring as evaluation
from rlreason.train import context
from rlreason.train import loaders
from rlreason.data import tasks
from rlreason.eval import trained
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.data import extract


def answer_fn(data_spec: str):
  """completion -> normalised final answer (None if unparsed), for maj@k."""
  kind, _, _ = data_lib.parse_spec(data_spec)
  find = tasks.extract_answer if kind == "task" else extract.extract

  def answer(text: str) -> str | None:
    a = find(text)
    return None if a is None else extract.normalize(a)

  return answer


def default_ks(samples: int) -> tuple[int, ...]:
  """1, 2, 4, ... below `samples`, and `samples` itself."""
  ks = [1 << i for i in range(samples.bit_length()) if 1 << i < samples]
  return tuple(ks + [samples])


def data_spec(policy: trained.Policy, data: str, num_problems: int) -> str:
  """`data`, or the run's held-out data; task specs get n=num_problems."""
  if not data:
    if not policy.recorded:
      raise data_lib.DataError(
        f"Checkpoint {policy.source} records no run: name the data (--data)"
      )
    data = context.eval_spec(policy.run_cfg)
  kind, location, options = data_lib.parse_spec(data)
  if kind != "task":
    return data
  if num_problems:
    options["n"] = str(num_problems)
  # Rebuilt with a single n= (eval_spec appends one after the run's own).
  items = ",".join(f"{k}={v}" for k, v in options.items())
  return f"task:{location}" + (f":{items}" if items else "")


@dataclasses.dataclass
class Report:
  """What `evaluate` measured; `write` turns it into files."""

  info: dict
  rows: dict[str, dict[str, tuple[float, float, float]]]
  examples: list
  prompts: list[str]
  greedy: evaluation.Scored | None
  sampled: evaluation.Scored | None

  @property
  def accuracy(self) -> float | None:
    """Greedy accuracy, if greedy decoding ran."""
    return None if self.greedy is None else float(self.greedy.correct.mean())

  def table(self) -> str:
    return evaluation.markdown_table(self.rows)


def evaluate(
  policy: trained.Policy,
  *,
  data: str = "",
  split: str = "eval",
  num_problems: int | None = None,
  samples: int = 1,
  temperature: float = 1.0,
  ks: Sequence[int] = (),
  greedy: bool = True,
  sequences_per_call: int = 0,
  journal_dir: str | None = None,
  interrupt=None,
  **overrides,
) -> Report:
  """Greedy accuracy and, with samples > 1, pass@k / maj@k / mean@k.

  Args:
    policy: from trained.load.
    data: a data spec ("" = the run's held-out data, as the loop evaluates).
    split: the split to load (task eval splits never overlap train).
    num_problems: the first N problems; 0 = all; None = the n= that
      `data` names, else the run's eval_size (BaseConfig's without a run).
    samples: n samples per problem; 1 = greedy only.
    temperature: sampling temperature of the n samples.
    ks: k values (each <= samples); () = default_ks(samples).
    greedy: also decode greedily when samples > 1.
    sequences_per_call: sequences per generate call (0 = the run's B * G).
    journal_dir: where each decoding (greedy, sampled) keeps its finished
      problems (scoring.sample_and_score's journal), one file per setting:
      an interrupted evaluation called again with the same settings starts
      after them. None keeps none. With several processes, process 0
      keeps them (on its own disk will do) and shares them on resume.
    interrupt: called between sampler calls and chunks (Context.interrupt,
      e.g. preemption.Preemption.interrupt); it raises to stop there, the
      journals keeping the finished problems.
    **overrides: BaseConfig fields (template, max_new_tokens, max_prompt_len,
      tokenizer, seed); None keeps the run's value.
  """
  ks = tuple(ks) or default_ks(samples)
  if samples < 1 or any(not 1 <= k <= samples for k in ks):
    raise ValueError(f"Need 1 <= k <= samples={samples}, got ks={ks}")
  if num_problems is None:  # 0: as many as a task spec's own n= loads
    kind, _, options = data_lib.parse_spec(data) if data else ("", "", {})
    named = kind == "task" and "n" in options
    num_problems = 0 if named else policy.run_cfg.eval_size
  spec = data_spec(policy, data, num_problems)
  overrides = {k: v for k, v in overrides.items() if v is not None}
  cfg = dataclasses.replace(policy.run_cfg, **overrides)
  cfg = dataclasses.replace(cfg, data=spec, reward="task")
  examples = data_lib.load(spec, split)
  examples = examples[:num_problems] if num_problems else examples
  tok = tokenizer_lib.load(cfg.tokenizer or policy.tokenizer)
  if tok.vocab_size > policy.model_cfg.vocab_size:
    raise ValueError(
      f"Tokenizer has {tok.vocab_size} ids but the model only "
      f"{policy.model_cfg.vocab_size}"
    )
  reward_fn, correct_fn = loaders.make_reward_fns(cfg)
  ctx = context.Context(
    cfg, policy.model_cfg, tok, policy.mesh, reward_fn, correct_fn
  )
  ctx.interrupt = interrupt
  common = dict(
    step=policy.step or 0,
    seed=cfg.seed,
    sequences_per_call=sequences_per_call or cfg.num_sequences,
    extract_fn=answer_fn(spec),
  )
  info = {
    "checkpoint": policy.source,
    "kind": policy.kind,
    "step": policy.step,
    "data": spec,
    "split": split,
    "problems": len(examples),
    "samples": samples,
    "temperature": temperature,
    "ks": list(ks),
    "template": cfg.template,
    "max_prompt_len": cfg.max_prompt_len,
    "max_new_tokens": cfg.max_new_tokens,
    "tokenizer": cfg.tokenizer or policy.tokenizer,
    "seed": cfg.seed,
  }

  def journal(name: str) -> str | None:
    """The journal of one decoding, named by everything its samples
    depend on (the checkpoint, data, lengths, template, seed, the model's
    dtypes)."""
    if not journal_dir:
      return None
    drop = ("ks",) + (("samples", "temperature") if name == "greedy" else ())
    setting = {k: v for k, v in info.items() if k not in drop}
    setting.update(decoding=name, model=policy.model_cfg)
    return evaluation.journal_path(journal_dir, name, setting)

  rows, greedy_scored, sampled = {}, None, None
  if greedy or samples == 1:
    greedy_scored = evaluation.sample_and_score(
      ctx,
      policy.params,
      examples,
      samples=1,
      journal=journal("greedy"),
      **common,
    )
    rows["greedy"] = evaluation.summarize(
      greedy_scored.correct, greedy_scored.answers, ks=(1,)
    )
  if samples > 1:
    sampled = evaluation.sample_and_score(
      ctx,
      policy.params,
      examples,
      samples=samples,
      temperature=temperature,
      journal=journal(f"n{samples}"),
      **common,
    )
    rows[f"n={samples}, T={temperature:g}"] = evaluation.summarize(
      sampled.correct, sampled.answers, ks=ks
    )
  prompts = [
    tokenizer_lib.apply_template(tok, e.question, cfg.template)
    for e in examples
  ]
  return Report(info, rows, examples, prompts, greedy_scored, sampled)


def plot_at_k(report: Report, path: str) -> bool:
  """pass@k, maj@k and mean@k of the sampled decoding against k (log2
  axis, 95% intervals as bars), greedy accuracy as a line; False (nothing
  written) with fewer than two k."""
  name = next((r for r in report.rows if r != "greedy"), None)
  metrics = report.rows.get(name, {})
  ks = sorted({int(m.split("@")[1]) for m in metrics})
  if len(ks) < 2:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for i, kind in enumerate(("pass", "maj", "mean")):
    at = [k for k in ks if f"{kind}@{k}" in metrics]
    if at:
      m, lo, hi = 100 * np.asarray([metrics[f"{kind}@{k}"] for k in at]).T
      ax.errorbar(at, m, yerr=[m - lo, hi - m], fmt="o-", capsize=3,
                  color=f"C{i}", label=f"{kind}@k")  # fmt: skip
  if "greedy" in report.rows:
    ax.axhline(100 * report.rows["greedy"]["pass@1"][0], color="gray",
               ls="--", label="greedy")  # fmt: skip
  ax.set_xscale("log", base=2)
  ax.set_xticks(ks, [str(k) for k in ks])
  ax.set_xlabel("k (samples per problem)")
  ax.set_ylabel("% of problems")
  info = report.info
  step = "" if info["step"] is None else f" (step {info['step']})"
  ax.set_title(
    f"{info['checkpoint']}{step}: {info['data']}, {name}", fontsize=9
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)
  return True


def write(report: Report, out_dir: str, samples_jsonl: bool = True) -> dict:
  """eval.md (table), eval.json, samples.jsonl and, with more than one k,
  at_k.png (plot_at_k) into `out_dir` (local or gs://: etils.epath);
  returns their paths."""
  out = epath.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  info = report.info
  step = "" if info["step"] is None else f" (step {info['step']})"
  md = (
    f"# Evaluation of {info['checkpoint']}{step}\n\n"
    f"{info['problems']} problems of `{info['data']}` ({info['split']} "
    f"split), template {info['template']}, up to {info['max_new_tokens']} "
    f"new tokens; {info['samples']} sample(s) per problem at temperature "
    f"{info['temperature']:g}.\n\n{report.table()}\n\n"
    "Percent, with 95% intervals over problems (Wilson for 0/1 scores).\n"
  )
  paths = {"md": os.path.join(out_dir, "eval.md")}
  epath.Path(paths["md"]).write_text(md)
  metrics = {
    row: {m: dict(zip(("mean", "low", "high"), v)) for m, v in r.items()}
    for row, r in report.rows.items()
  }
  paths["json"] = os.path.join(out_dir, "eval.json")
  storage.write_json(
    paths["json"], {**info, "accuracy": report.accuracy, "metrics": metrics}
  )
  if plot_at_k(report, os.path.join(out_dir, "at_k.png")):
    paths["png"] = os.path.join(out_dir, "at_k.png")
  if samples_jsonl:
    paths["jsonl"] = os.path.join(out_dir, "samples.jsonl")
    with epath.Path(paths["jsonl"]).open("w") as f:  # streamed, row by row
      for i, (e, prompt) in enumerate(zip(report.examples, report.prompts)):
        rec = {"uid": e.uid, "prompt": prompt, "gold": e.answer}
        for name, s in (("greedy", report.greedy), ("sampled", report.sampled)):
          if s is not None:
            rec[name] = {
              "completions": s.texts[i],
              "answers": s.answers[i],
              "correct": [bool(c) for c in s.correct[i]],
            }
        f.write(json.dumps(rec) + "\n")
  return paths
