r"""Logic-RL: rule-based RL on knights-and-knaves puzzles.

Paper: Xie et al. 2025, "Logic-RL: Unleashing LLM Reasoning with Rule-Based
Reinforcement Learning", arXiv:2502.14768. Authors' code: Unakar/Logic-RL.
Differs from experiments/grpo.py in exactly:
  (1) data: procedural knights-and-knaves puzzles with a difficulty knob
      (tasks/knights.py; the paper: 5K puzzles with 3 to 7 people), the
      answer in R1 tags: <think> reasoning </think> <answer> roles
      </answer> (task:knights_tags, tasks/tagged.py);
  (2) the think/answer system prompt (--template=r1, generation continues
      after "<think>") at paper scale;
  (3) a strict format reward that penalises shortcuts, plus a graded answer
      reward (rewards/format.py `logic_rl`): S = S_format + S_answer with
      S_format = +1 / -1 (each tag exactly once, in order, nothing outside
      them) and S_answer = +2 right / -1.5 wrong / -2 missing;
  (4) a difficulty schedule (rlreason/data/curriculum.py, --curriculum): easy
      puzzles first, then harder ones; the paper's ablation finds a
      curriculum beats a random shuffle of the same data
      (--curriculum="" trains on the shuffled mix);
  (5) REINFORCE++ instead of GRPO's group normalisation (the paper's
      choice over GRPO and PPO), with the paper's two modifications: the
      KL to the reference is a loss term (not a reward penalty), with
      GRPO's unbiased k3 estimator, coefficient 0.001;
  (6) temperature 0.7, constant lr 4e-7 at paper scale.
Laptop deviation: the R1 system prompt is ~480 characters, beyond the tiny
model's context, so the laptop run uses the bare puzzle (--template=plain)
and the warm start teaches the tags; the strict format check then reads the
completion from its own opening <think>.

Reproduces:
  laptop: the curriculum beats the shuffled mix on the same puzzles:
      python -m experiments.reproduce --method=logic_rl --seeds=0,1,2 \
        --testbed=tiny
    Expected: accuracy (and the held-out accuracy over difficulties 1-2) of
    the curriculum run at least the shuffled run's; measured numbers in
    experiments/README.md.
  paper: the K&K results table (Qwen2.5-7B after 3600 steps near the
    strongest proprietary reasoners on 2-8 people puzzles) and the transfer
    to AIME / AMC stated in the abstract; the numbers are not restated
    here.

CPU:  python -m experiments.logic_rl
TPU:  launch/tpu.sh run experiments.logic_rl --scale=paper \
        --model=/ckpt/Qwen2.5-7B-Instruct-1M \
        --workdir=gs://$BUCKET/logic_rl/$(date +%m%d_%H%M)
"""

import dataclasses

from experiments import grpo
from rlreason.data import curriculum
from rlreason.data import sources as data_lib
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.data import tasks
from rlreason.rewards import format as format_lib
from rlreason.data.tasks import tagged

tagged.register_all()  # task:knights_tags


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale, Logic-RL's choices; paper: PAPER."""

  # (1) 2-3 people (difficulty d = d + 1 people). Difficulty 1 has only
  # ~500 distinct train and 49 eval puzzles.
  data: str = "task:knights_tags:difficulty=1-2,n=900"
  eval_data: str = "task:knights_tags:difficulty=1-2,n=96"
  eval_size: int = 96
  max_prompt_len: int = 96
  max_new_tokens: int = 112  # 3-person solutions: up to 109 tokens
  template: str = "plain"  # (2) r1 at paper scale (see the docstring)
  warm_start_noise: float = 0.0  # noisy answers are for integer tasks
  # (4) batches 0..39 on 2-person puzzles, then the 2-3 person mix.
  curriculum: str = "0:1,40:1-2"
  advantage: str = "reinforce_plus_plus"  # (5)
  kl_coef: float = 0.001  # (5) in the loss
  kl_estimator: str = "k3"  # (5)
  temperature: float = 0.7  # (6)

  def validate(self) -> None:
    super().validate()
    if self.curriculum:
      curriculum.parse_schedule(self.curriculum)


# The paper's training setup: Qwen2.5-7B (Instruct-1M), 3600 steps,
# constant lr 4e-7, temperature 0.7, REINFORCE++ with a k3 KL loss, 3-7
# people puzzles of mixed difficulty. Not restated here, so assumptions
# below: batch size, rollouts per prompt, the KL coefficient and the
# curriculum's stage lengths (check them against Unakar/Logic-RL). The
# paper's puzzles are in natural language; ours use the compact notation
# of tasks/knights.py.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B-Instruct-1M",  # not a preset: a local HF dir
  data="task:knights_tags:difficulty=2-6,n=5000",  # 3-7 people, 5K
  eval_data="task:knights_tags:difficulty=1-7,n=700",  # 2-8 people
  eval_size=700,
  template="r1",  # (2)
  reward="task",
  batch_size=8,  # assumption
  group_size=8,  # assumption
  minibatches=1,
  micro_batches=8,
  max_prompt_len=1024,
  max_new_tokens=4096,
  temperature=0.7,  # (6)
  lr=4e-7,  # (6), constant
  schedule="constant",
  advantage="reinforce_plus_plus",
  kl_coef=0.001,  # assumption
  kl_estimator="k3",
  curriculum="0:2,1200:2-6",  # assumption: 3 people, then the 3-7 mix
  steps=3600,
  eval_every=200,
  checkpoint_every=100,
)


def make_batch(rollout, examples, ctx):
  """Strict format + graded answer reward (3); REINFORCE++ (5)."""
  cfg = ctx.cfg
  prefilled = "<think>" if cfg.template == "r1" else ""
  task = tasks.get(data_lib.parse_spec(cfg.data)[1])
  gold = [examples[i].answer for i in rollout.prompt_ids]
  r = format_lib.logic_rl(
    rollout.texts, gold, check=task.check, prefilled=prefilled
  )
  fmt = format_lib.format_strict(rollout.texts, prefilled=prefilled)
  return objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"logic_rl": r, "format": fmt})
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="logic_rl",
    title="Logic-RL (arXiv:2502.14768)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
    prompt_iterator=(
      curriculum.make(cfg.curriculum) if cfg.curriculum else None
    ),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
