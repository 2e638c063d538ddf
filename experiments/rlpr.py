r"""RLPR: the policy's probability of the reference answer as the reward.

Paper: Yu et al. 2025, "RLPR: Extrapolating RLVR to General Domains without
Verifiers", arXiv:2506.18254. Authors' code: OpenBMB/RLPR. Differs from
experiments/grpo.py in exactly:
  (1) no verifier: the reward is the policy's mean per-token probability
      of the REFERENCE answer y* written after its own reasoning z,
      r = mean_a pi(y*_a | x, z, y*_<a): the completion's final answer is
      replaced by y* and scored (self_scoring.reference_logprobs, one extra
      forward in make_batch; rewards/likelihood.py). A completion without
      a final answer keeps all its text as z, followed by --answer_opener;
  (2) debiasing: r_hat = clip(r - r', 0, 1), r' the same score with no
      reasoning (prompt + answer opener + y*), so only what the reasoning
      adds is rewarded (--debias);
  (3) std filtering: prompts whose G rewards have a std below beta times
      an exponential moving average of the mean group std of the steps
      before are dropped from the update (mask and advantage zeroed;
      likelihood.StdFilter with the authors' script's values: momentum
      0.99, beta 0.5, the average from step 6, filtering from step 11;
      checkpointed with the data's position, so a resumed run goes on
      with it), and fresh prompts are sampled in their place until the
      batch is full, as the authors' trainer (dynamic_sampling.refill,
      at most --refill_rounds rollouts a step, then the batch is
      completed with weightless dropped groups; 1 = drop only). Kept
      groups past the batch are not lost: their prompts wait in the
      checkpointed prompt iterator (iterator.PutBack) and, once a batch of
      them waits, are the next round's prompts, sampled again by the
      policy of then (the authors' filter_cache_regenerate;
      --regenerate_overflow).
  (4) the authors' other reward terms (OpenBMB/RLPR as its fork
      sharkchill-xy/DPPR carries it: prob.py, repetition.py):
      r = (1 - w) r_hat + w fmt with fmt their R1 tag check
      (format.format_tags; w = --format_weight, their 0.1: PAPER; 0 at
      laptop scale, where the tasks' answer line is no R1 format), then
      -1 on a nonzero reward when some 10 consecutive words repeat
      --repetition_limit times or more (their 10: PAPER; 0 = off).
  r' is the initial policy's, as the authors' (scored once per prompt
  before training): the whole training set is scored at the run's first
  step, before any update, and kept in <workdir>/rlpr_no_reasoning.json,
  which a resumed run reads (InitialScores).
  The authors' r' scores prompt + " " + y* (no opener), and a completion
  whose answer cannot be replaced (their empty ground-truth mask) scores
  r = 0: --no_reasoning_opener=false and --score_unanswered=false, both
  in PAPER; the laptop keeps the opener in both places (the procedural
  tasks' answer line, which the shipped base writes). Deviation from the
  authors' code: they sample until the batch is full however many
  rounds it takes; here the rounds are bounded (--refill_rounds).
The gold answers are read for the reward (as references) and for the
logged `accuracy`; the verifier itself is never used in the reward.

Reproduces:
  laptop: the reference-probability reward trains without a verifier about
    as well as the verifier reward:
      python -m experiments.reproduce --method=rlpr --seeds=0,1,2
    Expected: rlpr's held-out accuracy above the warm start's and close to
    grpo's. Measured numbers in experiments/README.md.
  paper: on Gemma, Llama and Qwen models, +7.6 TheoremQA and +7.5 Minerva
    over VeriFree, +1.6 average over General-Reasoner on seven benchmarks
    (abstract).

CPU:  python -m experiments.rlpr
TPU:  launch/tpu.sh run experiments.rlpr --scale=paper \
        --model=/ckpt/Qwen2.5-7B \
        --data=/data/rlpr_train.parquet:question,answer \
        --workdir=gs://$BUCKET/rlpr/$(date +%m%d_%H%M)
"""

import dataclasses
import functools
import os
from typing import ClassVar

import jax
import numpy as np
from absl import logging

from experiments import grpo
from rlreason import config
from rlreason import storage
from rlreason.data import difficulty
from rlreason.data import iterator
from rlreason.train import run_info
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import dynamic_sampling
from rlreason.rl import objective
from rlreason.rewards import format as format_lib
from rlreason.rewards import likelihood
from rlreason.rewards import repetition
from rlreason.rewards import self_scoring


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale, the probability reward; paper: PAPER."""

  # Runs recorded before these fields existed filtered at the whole average
  # from step 2 (seeded at step 1) and dropped what they filtered.
  absent_means: ClassVar[dict[str, object]] = {
    "std_filter_beta": 1.0,
    "std_filter_ema_start": 1,
    "std_filter_start": 2,
    "refill_rounds": 1,
    "regenerate_overflow": False,
  }

  # (1) What precedes y* when the completion has no final answer, and (2)
  # the whole text before y* without reasoning (left-stripped). The procedural
  # tasks' answer line; "<answer>" or "\\boxed{" for other formats.
  answer_opener: str = "\nanswer: "
  debias: bool = True  # (2) subtract the no-reasoning score
  std_filter: bool = True  # (3) drop prompts of low reward std
  std_filter_momentum: float = 0.99  # (3) the EMA's (filter_ema_ratio)
  std_filter_beta: float = 0.5  # (3) threshold / EMA (std_filter_beta)
  # (3) first step whose stds enter the EMA (filter_ema_start_step)
  std_filter_ema_start: int = 6
  # (3) first step the threshold drops prompts on (filter_start_step)
  std_filter_start: int = 11
  # (3) rollouts a step may take to refill dropped prompts (the authors':
  # until the batch is full); 1 = drop them only
  refill_rounds: int = 4
  # (3) kept groups past a full batch: their prompts are sampled again once
  # a batch of them waits (the authors' filter_cache_regenerate); false
  # drops them
  regenerate_overflow: bool = True
  # (1) false: a completion without a final answer scores r = 0 (the
  # authors' empty ground-truth mask) instead of the opener fallback
  score_unanswered: bool = True
  # (2) false: r' scores prompt + " " + y* (the authors' scoreA) instead of
  # prompt + the left-stripped --answer_opener + y*
  no_reasoning_opener: bool = True
  format_weight: float = 0.0  # (4) w of the R1 format score; 0 = off
  # (4) -1 when 10 consecutive words occur this often; 0 = off
  repetition_limit: int = 0

  def validate(self) -> None:
    super().validate()
    config.require(
      0 <= self.std_filter_momentum < 1,
      f"--std_filter_momentum={self.std_filter_momentum} not in [0, 1)",
    )
    config.require(
      self.std_filter_beta >= 0
      and self.std_filter_ema_start >= 1
      and self.std_filter_start >= 1,
      "--std_filter_beta must be >= 0 and --std_filter_ema_start, "
      "--std_filter_start >= 1",
    )
    config.require(
      self.refill_rounds >= 1,
      f"--refill_rounds={self.refill_rounds} must be >= 1",
    )
    config.require(
      0 <= self.format_weight <= 1 and self.repetition_limit >= 0,
      f"--format_weight={self.format_weight} must be in [0, 1] and "
      f"--repetition_limit={self.repetition_limit} >= 0",
    )


# What the abstract states: Gemma, Llama and Qwen base models on general-
# domain data with reference answers. The authors' script (as their forks
# carry it) has lr 1e-6, KL 0, 3072 new tokens and clip-high 0.27; its
# 768 prompts a step (mini-batch 192), 2048-token prompts, token-mean loss
# and entropy bonus 0.001 are not taken here; the training set (the
# authors' RLPR-train WebInstruct subset), batch and samples are
# assumptions.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B",  # a local HF dir
  data="data/rlpr_train.parquet:question,answer",
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  eval_size=500,
  template="r1",
  answer_opener="</think>\n<answer>",
  score_unanswered=False,  # (1) as the authors' reward manager
  no_reasoning_opener=False,  # (2) as the authors' scoreA
  reward="math",  # only for the logged accuracy
  batch_size=128,  # assumption
  group_size=8,  # assumption
  minibatches=2,
  micro_batches=16,
  max_new_tokens=3072,
  lr=1e-6,
  kl_coef=0.0,
  clip_eps_high=0.27,
  format_weight=0.1,  # (4) the authors' format_coefficient
  repetition_limit=10,  # (4) their max_repetitions_limit
  steps=500,  # assumption
  eval_every=25,
)


class InitialScores:
  """(2) r' of every training prompt by the initial policy.

  `prompts` is the loop's prompt_iterator hook: it keeps the training set
  and returns the default iterator. The first call (the run's first step,
  before any update) scores every training prompt with ctx.params and
  writes {uid: r'} to `path`; later calls, and a resumed run, read them.
  A prompt missing from a saved file (a resumed run with other data) is
  scored by the current policy, with a warning.
  """

  def __init__(self, path: str):
    self.path = path
    self.examples = None
    self.scores = None

  def prompts(self, cfg, train_examples):
    self.examples = train_examples
    return iterator.default(cfg, train_examples)

  def __call__(self, ctx, examples, score) -> np.ndarray:
    """[B] r' of `examples`; `score(prompt_ids, prefixes, references)`."""
    if self.scores is None:
      self.scores = storage.read_json(self.path)
      if self.scores is None:
        if ctx.step:
          logging.warning(
            "%s is missing at step %d: r' is scored by the current policy",
            self.path,
            ctx.step,
          )
        self.scores = self._score(ctx, self.examples or examples, score)
        if jax.process_index() == 0:
          storage.write_json(self.path, self.scores)
    missing = [e for e in examples if e.uid not in self.scores]
    if missing:
      logging.warning(
        "%d prompts have no r' in %s: scored by the current policy",
        len(missing),
        self.path,
      )
      self.scores.update(self._score(ctx, missing, score))
    return np.asarray([self.scores[e.uid] for e in examples], np.float32)

  @staticmethod
  def _score(ctx, examples, score) -> dict:
    cfg = ctx.cfg
    opener = cfg.answer_opener.lstrip() if cfg.no_reasoning_opener else " "
    values = score(
      ctx.encode_prompts(examples),
      [opener] * len(examples),
      [e.answer for e in examples],
    )
    return {e.uid: float(v) for e, v in zip(examples, values, strict=True)}


def make_batch(rollout, examples, ctx, *, std_filter=None, initial=None):
  """Reference-answer probability (1), debiased (2), std-filtered (3).

  `std_filter` is the run's likelihood.StdFilter (state across steps);
  None skips (3). `initial` is the run's InitialScores (r' by the initial
  policy); None scores r' with the current policy (ctx.params).
  """
  cfg = ctx.cfg
  g = cfg.group_size
  prompts = ctx.encode_prompts(examples)
  refs = [examples[i].answer for i in rollout.prompt_ids]
  score = functools.partial(self_scoring.reference_probs, ctx)
  spans = self_scoring.answer_char_spans(rollout.texts)
  prob = score(
    [prompts[i] for i in rollout.prompt_ids],
    self_scoring.reasoning_prefixes(rollout.texts, cfg.answer_opener, spans),
    refs,
  )
  if not cfg.score_unanswered:  # (1) no answer to replace: r = 0
    prob = np.where([s is not None for s in spans], prob, 0.0)
    prob = prob.astype(np.float32)
  r, parts = prob, {"ref_prob": prob}
  if cfg.debias:  # (2) once per prompt, broadcast to its G completions
    if initial is None:
      base = InitialScores._score(ctx, examples, score)
      base = np.asarray([base[e.uid] for e in examples], np.float32)
    else:
      base = initial(ctx, examples, score)
    r = likelihood.debiased(prob, np.repeat(base, g))
    parts["ref_prob_no_reasoning"] = np.repeat(base, g)
  if cfg.format_weight:  # (4)
    prefilled = "<think>" if cfg.template == "r1" else ""
    fmt = format_lib.format_tags(rollout.texts, prefilled=prefilled)
    r = (1 - cfg.format_weight) * r + cfg.format_weight * fmt
    parts["format"] = fmt
  if cfg.repetition_limit:  # (4) on nonzero rewards only, as theirs
    rep = repetition.repeats(rollout.texts, limit=cfg.repetition_limit)
    r = np.where(rep & (r != 0), r - 1.0, r).astype(np.float32)
    parts["repetition"] = rep.astype(np.float32)
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, parts)
  )
  if std_filter is not None:  # (3)
    keep = std_filter(r, g, step=ctx.step)
    batch = objective.drop_groups(batch, keep, g)
    metrics["rlpr/kept"] = float(keep.mean())
    metrics["rlpr/std_threshold"] = std_filter.threshold
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  std_filter = None
  if cfg.std_filter:  # (3)
    std_filter = likelihood.StdFilter(
      momentum=cfg.std_filter_momentum,
      scale=cfg.std_filter_beta,
      ema_start=cfg.std_filter_ema_start,
      filter_start=cfg.std_filter_start,
    )
  initial = InitialScores(
    os.path.join(run_info.workdir_for(cfg, "rlpr"), "rlpr_no_reasoning.json")
  )
  batch_fn = functools.partial(
    make_batch, std_filter=std_filter, initial=initial
  )
  prompts = initial.prompts
  if std_filter is not None:  # (3) its state goes with the checkpoints
    # Kept prompts past a full batch wait here (always in the iterator,
    # so a run resumed with --regenerate_overflow changed reads its state).
    queue = iterator.PutBack()
    prompts = difficulty.tracked_iterator(
      std_filter, base=queue.wrap(initial.prompts)
    )
    if cfg.refill_rounds > 1:
      batch_fn = dynamic_sampling.refill(
        batch_fn,
        max_rounds=cfg.refill_rounds,
        keep=dynamic_sampling.kept_groups,
        put_back=queue.put_back if cfg.regenerate_overflow else None,
      )
  return loop.train_and_report(
    cfg,
    name="rlpr",
    title="RLPR (arXiv:2506.18254)",
    make_batch=batch_fn,
    loss_fn=objective.loss_fn,
    prompt_iterator=prompts,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
