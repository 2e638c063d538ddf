r"""GRPO: group-relative policy optimisation (the main job).

Paper: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical
Reasoning in Open Language Models", arXiv:2402.03300, Sec. 4.1.
Differs from PPO in exactly:
  (1) no value model: the advantage of every token of completion i is its
      group-normalised outcome reward (r_i - mean(r)) / std(r) over the G
      completions of the same prompt (outcome supervision, Sec. 4.1.2);
  (2) the KL to the frozen reference is a loss term (k3 estimator, Eq. 4)
      with coefficient beta = 0.04, not a per-token reward penalty;
  (3) the objective averages tokens within each completion, then
      completions (Eq. 3): seq-mean-token-mean.

Reproduces (paper scale): Table 5, "DeepSeekMath-RL 7B": GSM8K 88.2%,
MATH 51.7% (top-1, chain of thought), from DeepSeekMath-Instruct 7B
(82.9% / 46.8%). Those checkpoints are not among our presets; `--scale=paper`
uses the paper's algorithmic settings on Qwen2.5-Math-7B and GSM8K.

Laptop scale (no flags): GRPO from the shipped laptop base
(`--model=laptop-base`, pretrained by experiments/pretrain.py on worked
+/- chains) on level-2 `addsub5_order` problems, whose answer depends on
working left to right; the base greedily writes the other school it saw
("+, then -") and RL moves that choice. Held-out greedy accuracy is
measured before, every 10 steps and after; the workdir gets metrics.jsonl,
TensorBoard events, a checkpoint, config.json and report.md with plots.
Expected: see README ("The main job"). The other experiments build on
`TinyConfig` (the "tiny" preset warm-started on arithmetic).

CPU:  python -m experiments.grpo
TPU:  launch/tpu.sh run experiments.grpo --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B --data=/data/gsm8k/train.jsonl \
        --workdir=gs://$BUCKET/grpo/$(date +%m%d_%H%M)
"""

import dataclasses

from rlreason import config
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class TinyConfig(objective.PGConfig):
  """The laptop testbed the other experiments subclass: the "tiny" preset
  warm-started on arithmetic. The main job's defaults are `Config` below;
  the paper's values are in PAPER."""

  data: str = "task:arithmetic:difficulty=1,n=4000"
  template: str = "plain"
  steps: int = 120
  batch_size: int = 16
  group_size: int = 8
  max_prompt_len: int = 32
  max_new_tokens: int = 40
  temperature: float = 1.0
  lr: float = 2e-4  # 5e-4 and above made the tiny policy worse (README)
  warmup_steps: int = 5
  # The warm start imitates an imperfect demonstrator: 60% of its solutions
  # end with an off-by-one answer line (sft.encode_pairs). Its greedy
  # accuracy is low while samples are often right: the regime where RL from
  # a verifier helps (on exact demonstrations the tiny model's errors are
  # missing arithmetic facts, which 120 GRPO steps did not fix; README).
  warm_start_steps: int = 600
  warm_start_noise: float = 0.6
  eval_size: int = 200
  checkpoint_every: int = 20

  # GRPO's own knobs (objective.PGConfig holds the rest).
  advantage: str = "grpo"  # (1) group-normalised outcome reward
  kl_coef: float = 0.04  # (2) beta, Sec. 4.2, with the k3 estimator
  kl_estimator: str = "k3"
  clip_eps_low: float = 0.2  # epsilon of Eq. 3 (value not stated; PPO's)
  clip_eps_high: float = 0.2
  aggregation: str = "seq-mean-token-mean"  # (3) Eq. 3


@dataclasses.dataclass(frozen=True)
class Config(TinyConfig):
  """The main job (no flags): GRPO from the shipped laptop base
  (rlreason/model/laptop_base, pretrained on the synthetic corpus by
  experiments/pretrain.py; its card is the README.md there) on level-2
  `addsub5_order` problems, where the base's two schools disagree and its
  greedy choice is the wrong one. No warm start: RL starts from the base."""

  model: str = "laptop-base"
  data: str = "task:addsub5_order:difficulty=2,n=1000"
  max_new_tokens: int = 128
  lr: float = 3e-4
  steps: int = 40
  warm_start_steps: int = 0
  warm_start_noise: float = 0.0
  eval_size: int = 140  # every held-out level-2 addsub5_order problem
  eval_every: int = 10
  checkpoint_every: int = 10


# experiments/reproduce.py --testbed=tiny: the claims compare grpo with the
# other experiments on the tiny testbed they build on (its default testbed,
# base, is this module's Config: the main job).
TESTBED = TinyConfig


# Sec. 4.2 ("Training and Evaluating DeepSeekMath-RL"): lr 1e-6, beta 0.04,
# 64 samples per question, max length 1024, batch 1024, a single policy
# update per exploration stage. The paper trains DeepSeekMath-Instruct 7B on
# GSM8K + MATH chain-of-thought questions (144K).
PAPER = dict(
  config.PAPER_COMMON,
  model="qwen2.5-math-7b",
  data="hf:openai/gsm8k:config=main",
  eval_data="hf:openai/gsm8k:config=main,split=test",
  steps=500,
  batch_size=16,  # 1024 sequences = 16 questions x 64 samples
  group_size=64,
  max_prompt_len=512,
  max_new_tokens=1024,
  lr=1e-6,
  ppo_epochs=1,
  minibatches=1,
  # 32 rows per micro-batch: fits a v4-32 with 15% of HBM free
  # (experiments.plan; the paper gives no micro-batch size).
  micro_batches=32,
  eval_size=1319,
  eval_every=0,  # the laptop main job's mid-run evaluations, off
  checkpoint_every=50,
)


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="grpo",
    title="GRPO (DeepSeekMath)",
    make_batch=objective.make_batch,  # (1)
    loss_fn=objective.loss_fn,  # (2), (3)
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
