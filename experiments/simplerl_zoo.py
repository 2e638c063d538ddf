r"""SimpleRL-Zoo: zero RL from a base model, its two levers as flags.

Paper: Zeng et al. 2025, "SimpleRL-Zoo: Investigating and Taming Zero
Reinforcement Learning for Open Base Models in the Wild",
arXiv:2503.18892. Authors' code: hkust-nlp/simpleRL-reason. Differs from
experiments/grpo.py in exactly:
  (1) zero RL: GRPO straight from the base model (no SFT, --warm_start_steps
      0 at paper scale) with a rule reward on the final answer;
  (2) lever 1, the format reward (--format_reward): "none" rewards
      correctness alone (1 / 0); "strict" gives -1 to a response without
      a parsable final answer, correctness otherwise
      (rewards/format.py `format_gated`). The paper finds that enforcing
      a rigid format can hold back exploration for some base models;
  (3) lever 2, query difficulty (--data): the training data's difficulty
      is matched to the base model (the paper's Easy / Medium / Hard MATH
      subsets; weaker models need easier data), with the evaluation set
      (--eval_data) fixed across choices;
  (4) a small KL (1e-4) and 8 samples per prompt at temperature 1.
Laptop deviation: a tiny random model cannot do zero RL, so its "base
model" is grpo.py's warm start (trained on difficulty 1, --warm_start_data),
shared by every lever setting; the levers then change only the RL phase.

Reproduces:
  laptop: matched query difficulty trains better than too-hard queries;
    the strict format reward is a separate variant:
      python -m experiments.reproduce --method=simplerl_zoo --seeds=0,1,2 \
        --testbed=tiny
    Expected: held-out accuracy (difficulties 1-2) of difficulty 1 above
    that of difficulty 3; measured numbers in experiments/README.md.
  paper: the per-model tables (10 base models, Llama3-8B to Qwen2.5-32B):
    zero RL raises every model's average accuracy once format reward and
    data difficulty are set per model; numbers not restated here.

CPU:  python -m experiments.simplerl_zoo
TPU:  launch/tpu.sh run experiments.simplerl_zoo --scale=paper \
        --model=/ckpt/Qwen2.5-7B \
        --data=/data/simplerl/hard.parquet:problem,answer \
        --workdir=gs://$BUCKET/simplerl_zoo/$(date +%m%d_%H%M)
"""

import dataclasses

import numpy as np

from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.data import extract
from rlreason.rewards import format as format_lib


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with SimpleRL-Zoo's levers; paper: PAPER."""

  format_reward: str = "none"  # (2) none | strict
  format_penalty: float = -1.0  # (2) reward of a response without answer
  # (3) --data picks the difficulty (laptop: task:arithmetic:difficulty=d);
  # the evaluation set stays fixed.
  eval_data: str = "task:arithmetic:difficulty=1-2,n=200"
  warm_start_data: str = grpo.TinyConfig.data  # the laptop "base model"
  # (3) Room for every level's solutions (level 3: <= 53 tokens), so the
  # too-hard level is hard, not cut (at grpo's 40, 2414 of 4000 were).
  max_new_tokens: int = 56
  kl_coef: float = 1e-4  # (4)

  def validate(self) -> None:
    super().validate()
    if self.format_reward not in ("none", "strict"):
      raise ValueError(
        f"Invalid config: --format_reward={self.format_reward!r}; expected "
        "none or strict"
      )


# The paper's common recipe as we read it: GRPO from the base model, 8
# samples per prompt at temperature 1.0, lr 1e-6, KL 1e-4, 1024 sequences
# per rollout batch. Per-model data (Easy: GSM8K + MATH level 1; Medium:
# MATH 1-4; Hard: MATH 3-5, about 8K problems each) and the response
# length are set per model in the paper; Hard for Qwen2.5-7B here.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B",  # a base model, local HF dir
  data="data/simplerl/hard.parquet:problem,answer",  # (3) MATH 3-5
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  eval_size=500,
  warm_start_data="",
  warm_start_steps=0,  # (1)
  template="boxed",
  reward="math",
  # App. B.5 and the README's 7B command: 1024 prompts a step; kept at 128
  # here (the planned programs' batch), so 4 updates of 256 sequences.
  batch_size=128,
  group_size=8,
  minibatches=4,
  micro_batches=16,
  max_prompt_len=1024,
  max_new_tokens=8192,  # App. B.5, every model
  temperature=1.0,
  lr=5e-7,  # train_grpo_math_tune_ray.sh's LEARNING_RATE
  entropy_coef=0.001,  # the README command's --entropy_coeffient
  aggregation="token-mean",  # App. A: 1 / sum |o_i| over all tokens
  kl_coef=1e-4,
  steps=100,  # assumption
  eval_every=10,
)


def make_batch(rollout, examples, ctx):
  """Correctness, gated by the format (2) when asked; GRPO advantages."""
  cfg = ctx.cfg
  correct = objective.correctness(rollout, examples, ctx)
  parsable = np.array(
    [extract.extract(t) is not None for t in rollout.texts], np.float32
  )
  r = correct
  if cfg.format_reward == "strict":
    r = format_lib.format_gated(correct, parsable, penalty=cfg.format_penalty)
  return objective.outcome_batch(
    rollout,
    examples,
    ctx,
    rewards=(r, {"correct": correct, "format": parsable}),
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  cfg = loop.warm_started(
    cfg, "simplerl_zoo", data=cfg.warm_start_data or cfg.data
  )
  return loop.train_and_report(
    cfg,
    name="simplerl_zoo",
    title="SimpleRL-Zoo (arXiv:2503.18892)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
