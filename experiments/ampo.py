r"""AMPO: adaptive multi-teacher guidance, only where the policy fails.

Paper: "More Than One Teacher: Adaptive Multi-Guidance Policy Optimization
for Diverse Exploration" (2025, arXiv:2510.02227). Differs from
experiments/grpo.py in exactly:
  (1) guidance on demand: only a group with no correct answer receives
      off-policy solutions; the others are plain on-policy GRPO;
  (2) several guidance sources (--teachers): frozen teacher models
      (rlreason/eval/teacher.py; laptop: the exact-solution SFT "warm_start")
      sampling --teacher_samples solutions each, and "reference", the
      stored solution; only verified-correct solutions are candidates;
  (3) comprehension-based selection: the --replace candidates the student
      comprehends best replace that many of the group's on-policy
      completions (guidance.replace_rows). Comprehension is the authors'
      (SII-Enigma/AMPO: their RLPR-style 'prob' reward manager): the
      student's mean token probability of the gold answer written after
      the candidate's reasoning, minus the same with no reasoning (prompt,
      --answer_opener, answer), floored at 0 (`comprehension`;
      self_scoring.reference_probs). Their 0.1 x format score in that sum
      is left out (no R1 format here);
  (4) mixed-policy loss: PPO on on-policy rows (dual-clipped with
      --dual_clip, the authors' 10: PAPER), and on the off-policy rows
      a policy gradient with the shaped weight r / (r + gamma) of LUFFY
      (guidance.mixed_policy_loss, behaviour probability taken as 1).

Reproduces:
  laptop: AMPO vs GRPO vs a single guidance source:
      python -m experiments.reproduce --method=ampo --seeds=0,1,2
    Expected: ampo's held-out accuracy >= grpo's; two sources >= one.
  paper: +4.3% on math and +12.2% out of distribution over GRPO (abstract;
    four peer-sized teachers).

CPU:  python -m experiments.ampo
TPU:  launch/tpu.sh run experiments.ampo --scale=paper \
        --model=/ckpt/Qwen2.5-7B-Instruct \
        --teachers=/ckpt/teacher_a,/ckpt/teacher_b,reference \
        --workdir=gs://$BUCKET/ampo/$(date +%m%d_%H%M)
"""

import dataclasses
import functools
from typing import ClassVar

import jax
import numpy as np

from experiments import claims
from experiments import grpo
from rlreason import config
from rlreason.train import flags as rr_flags
from rlreason.guidance import offpolicy as guidance
from rlreason.guidance import resampling as guided
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.eval import teacher as teacher_lib
from rlreason.rewards import self_scoring
from rlreason.plan import program


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with AMPO's guidance; paper: PAPER."""

  model_fields: ClassVar = {"teachers": (("warm_start", "reference"), True)}

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=1-3,n=4000"
  max_new_tokens: int = 48
  # (2) guidance sources, comma-separated: model directories (or RL runs),
  # warm_start, reference
  teachers: str = "warm_start,reference"
  teacher_steps: int = 0  # "warm_start" teacher: SFT steps (0 = the same)
  teacher_samples: int = 2  # (2) solutions per teacher and prompt
  replace: int = 2  # (3) off-policy rows per all-wrong group (assumed)
  # (4) gamma of the off-policy rows' weight r / (r + gamma)
  shaping_gamma: float = 0.1
  # (3) what precedes the gold answer when a candidate has no final answer,
  # and the no-reasoning baseline's text (rlpr's --answer_opener)
  answer_opener: str = "\nanswer: "
  kl_coef: float = 0.0  # mixed-policy methods drop the KL (LUFFY)

  def sources(self) -> list[str]:
    return [t.strip() for t in self.teachers.split(",") if t.strip()]

  def teacher_models(self) -> int:
    """The models among the sources ("reference" is the stored solution)."""
    return sum(s != "reference" for s in self.sources())

  def validate(self) -> None:
    super().validate()
    for name in ("replace", "teacher_steps"):
      value = getattr(self, name)
      config.require(value >= 0, f"--{name}={value} must be >= 0")
    for source in self.sources():
      if source != "reference":
        teacher_lib.check(source, self.teacher_steps, self.warm_start_steps)
    config.require(
      self.teacher_samples >= 1,
      f"--teacher_samples={self.teacher_samples} must be >= 1",
    )
    config.require(
      self.shaping_gamma > 0,
      f"--shaping_gamma={self.shaping_gamma} must be > 0",
    )


# The shipped-base testbed (reproduce.py --testbed=base): the hard
# level-3 problems, where all-wrong groups stay common (claims.BASE_LEVEL3),
# and a teacher SFT'd on the base (claims.BASE_TEACHER), not the base itself.
BASE = {**claims.BASE_LEVEL3, **claims.BASE_TEACHER}


# Four peer-sized teachers (abstract); models and budgets assumed. The
# authors' train_ampo.sh: group-mean advantages without the std
# (norm_adv_by_std_in_grpo=False: dr_grpo's), the loss summed over tokens
# and divided by the response budget (loss_remove_token_mean), verl's
# entropy bonus 0.001, weight decay 0.1, 510 steps, and the on-policy
# rows' dual clip 10 (clip_ratio_c). Not taken: 128 prompts a step in 2
# mini-batches and 1024-token prompts (they change the planned programs).
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B-Instruct",  # assumed
  teachers="/ckpt/teacher_1,/ckpt/teacher_2,/ckpt/teacher_3,/ckpt/teacher_4",
  group_size=8,  # assumed
  teacher_samples=1,  # assumed
  max_new_tokens=8192,  # assumed
  kl_coef=0.0,
  answer_opener="\\boxed{",  # (3) grpo.PAPER's boxed template
  advantage="dr_grpo",
  aggregation="seq-mean-token-sum-norm",
  entropy_coef=0.001,
  weight_decay=0.1,
  dual_clip=10.0,  # (4) on-policy rows (their mix_core_alg.py)
  steps=510,
)


def samplers(cfg) -> dict:
  """The planner's other samplers (experiments/plan.py): the teacher models
  of --teachers ("reference" is the stored solution, not a model), each
  loaded once and kept, in the compute dtype, sampling --teacher_samples
  solutions for every prompt in turn (the most (1) asks: every group all
  wrong) as the policy's rollout samples (Context.generate). Their
  architecture is assumed the policy's: the paper's teachers are
  peer-sized, and PAPER's checkpoint paths name none."""
  if not cfg.teacher_models():
    return {}
  return {
    "teachers": program.Sampler(
      dataclasses.replace(cfg, group_size=cfg.teacher_samples),
      cfg.teacher_models(),
    )
  }


def score_forwards(cfg) -> int:
  """(3) comprehension: the student's scores of the gold answer after
  every candidate (each teacher model's --teacher_samples and the stored
  solution, per prompt; every group all wrong) and once without reasoning,
  in whole-batch forwards of N rows beside the reference's
  (experiments/plan.py times them)."""
  per_prompt = (
    1
    + cfg.teacher_models() * cfg.teacher_samples
    + ("reference" in cfg.sources())
  )
  return -(-per_prompt // cfg.group_size)


def candidates(examples, ctx, teachers) -> list[list[str]]:
  """(2) Verified-correct solutions per prompt from every source."""
  cfg = ctx.cfg
  out = [[] for _ in examples]
  for k, (name, t) in enumerate(teachers):
    if name == "reference":
      texts = [[e.solution] if e.solution else [] for e in examples]
    else:
      key = jax.random.fold_in(jax.random.key(cfg.seed), (1 << 21) + k)
      ro = t.generate(ctx, examples, key, group_size=cfg.teacher_samples)
      texts = [[] for _ in examples]
      for i, text in zip(ro.prompt_ids, ro.texts):
        texts[i].append(text)
    for i, e in enumerate(examples):
      ok = ctx.correct_fn(texts[i], [e.answer] * len(texts[i]))
      out[i] += [s for s, c in zip(texts[i], ok) if c > 0]
  return out


def comprehension(ctx, examples, pairs) -> np.ndarray:
  """(3) [len(pairs)] the student's comprehension of each candidate
  (example index j, solution text): max(p(gold | prompt, its reasoning) -
  p(gold | prompt), 0), p the mean token probability of the gold answer
  (self_scoring.reference_probs), the baseline once per example."""
  opener = ctx.cfg.answer_opener
  prompts = ctx.encode_prompts(examples)
  gold = [e.answer for e in examples]
  score = functools.partial(self_scoring.reference_probs, ctx)
  with_reasoning = score(
    [prompts[j] for j, _ in pairs],
    self_scoring.reasoning_prefixes([s for _, s in pairs], opener),
    [gold[j] for j, _ in pairs],
  )
  alone = score(prompts, [opener.lstrip()] * len(examples), gold)
  return np.maximum(with_reasoning - alone[[j for j, _ in pairs]], 0.0)


def make_batch_fn(teachers):
  def make_batch(rollout, examples, ctx):
    cfg, g = ctx.cfg, ctx.cfg.group_size
    total, parts = ctx.score(rollout, examples)
    total = np.array(total, np.float32)
    metrics = objective.reward_metrics(total, parts, rollout, examples, ctx)
    batch = ctx.batch_from_rollout(rollout)
    batch["off_policy"] = np.zeros(len(total), np.float32)
    fails = np.flatnonzero(
      guided.unsolved(objective.correctness(rollout, examples, ctx), g)
    )
    chosen, rows = [], []
    if len(fails):  # (1)
      hard = [examples[b] for b in fails]
      cands = candidates(hard, ctx, teachers)
      pairs = [(j, s) for j, c in enumerate(cands) for s in c]
      if pairs:
        score = comprehension(ctx, hard, pairs)
        for j in range(len(hard)):  # (3)
          idx = [p for p, (jj, _) in enumerate(pairs) if jj == j]
          best = sorted(idx, key=lambda p: -score[p])[: cfg.replace]
          for r, p in enumerate(best):
            chosen.append((hard[j], pairs[p][1]))
            rows.append(fails[j] * g + g - 1 - r)
    if rows:
      traces = guidance.trace_batch(
        ctx, [e for e, _ in chosen], [s for _, s in chosen], behavior="one"
      )
      batch = guidance.replace_rows(
        batch, np.asarray(rows), traces, ctx.tokenizer.pad_id
      )
      t_total, _ = ctx.reward_fn(
        [s for _, s in chosen], [e.answer for e, _ in chosen]
      )
      total[rows] = np.asarray(t_total, np.float32)
    if cfg.needs_ref:
      batch["ref_logp"] = guided.batch_ref_logp(batch, ctx)
    batch["adv"] = np.asarray(
      objective.outcome_advantages(total, cfg, mask=batch["mask"]),
      np.float32,
    )
    metrics["ampo/guided_groups"] = len(set(r // g for r in rows)) / max(
      len(examples), 1
    )
    metrics["ampo/offpolicy_rows"] = len(rows) / len(total)
    metrics["adv_abs"] = float(np.abs(batch["adv"]).mean())
    return batch, metrics

  return make_batch


def train_fields(cfg) -> dict:
  """Per-row shapes of the batch fields the loss reads beyond
  objective.loss_fn's (the planner's abstract batch, experiments/plan.py)."""
  del cfg
  return {"off_policy": ()}


def loss_fn(params, batch, norm, *, cfg, model_cfg):
  """(4) pg_loss with the mixed-policy surrogate."""
  return guidance.mixed_pg_loss(
    params,
    batch,
    norm,
    cfg=cfg,
    model_cfg=model_cfg,
    shaping_gamma=cfg.shaping_gamma,
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  teachers = [
    (
      s,
      None
      if s == "reference"
      else teacher_lib.Teacher(s, steps=cfg.teacher_steps),
    )
    for s in cfg.sources()
  ]
  return loop.train_and_report(
    cfg,
    name="ampo",
    title="AMPO (arXiv:2510.02227)",
    make_batch=make_batch_fn(teachers),
    loss_fn=loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
