r"""Dr. GRPO: GRPO without its response-length and difficulty biases.

Paper: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
Perspective", arXiv:2503.20783. Authors' code: sail-sg/understand-r1-zero
(on sail-sg/oat). Differs from experiments/grpo.py in exactly:
  (1) advantages are not divided by the group std: A_i = r_i - mean(r)
      (the std up-weights too easy / too hard questions);
  (2) each completion's token-loss sum is divided by a constant, the
      generation budget T = max_new_tokens, not by its own length |o_i|
      ("seq-mean-token-sum-norm"; oat: masked_sum(..., generate_max_length)).
      1/|o_i| penalises long wrong answers less per token than short ones,
      so GRPO grows the length of incorrect responses;
  (3) no KL term (--beta 0 in every authors' command).
The authors' code (train_zero_math.py, not the paper) also gives a
completion cut off at the length limit, without EOS, reward 0, for GRPO
and Dr. GRPO alike: --zero_truncated, on in PAPER, off on the laptop,
whose reproduction compares the two objectives alone.

Reproduces:
  laptop: the paper's Fig. 1 (right) claim, the length of incorrect
    responses keeps growing under GRPO and not under Dr. GRPO:
      python -m experiments.reproduce --method=dr_grpo --seeds=0,1,2
    compares `length/incorrect` of this file against experiments/grpo.py
    with --kl_coef=0 (the paper switches only --critic_type grpo/drgrpo).
    Expected: Dr. GRPO's wrong-answer length at or below GRPO's; measured
    numbers in experiments/README.md.
  paper: the minimalist recipe, Qwen2.5-Math-7B + Dr. GRPO on MATH levels
    3-5 with the Qwen-Math template: 43.3% on AIME 2024 (abstract).

CPU:  python -m experiments.dr_grpo
TPU:  launch/tpu.sh run experiments.dr_grpo --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --data=/data/math_lvl3to5_8k:problem,answer \
        --workdir=gs://$BUCKET/dr_grpo/$(date +%m%d_%H%M)
"""

import dataclasses


from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with Dr. GRPO's objective; paper: PAPER."""

  advantage: str = "dr_grpo"  # (1) r - mean(r), no std
  # (2) each completion's token sum / max_new_tokens, averaged over them
  aggregation: str = "seq-mean-token-sum-norm"
  kl_coef: float = 0.0  # (3) --beta 0
  # Reward 0 for completions that end at max_new_tokens without EOS (the
  # authors' "Set zero reward for truncated outputs").
  zero_truncated: bool = False


# The authors' examples/qwen2.5-math-7b.sh, "Qwen-Math template" command
# (the AIME 43.3% recipe of the abstract: Qwen2.5-Math-7B, MATH levels 3-5).
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",  # --pretrain Qwen/Qwen2.5-Math-7B
  # --prompt_data ./datasets/train/math_lvl3to5_8k: a save_to_disk folder
  # in the authors' repository; point --data at your copy.
  data="datasets/train/math_lvl3to5_8k:problem,answer",
  # Their evaluation_suite holds AIME24, AMC, MATH500, Minerva and
  # OlympiadBench; the headline number is AIME 2024.
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  eval_size=30,
  template="boxed",  # --prompt_template qwen_math (boxed system prompt)
  reward="math",  # --oracle math --verifier_version math_verify
  zero_truncated=True,  # their actor's step: no EOS -> reward 0
  # 128 prompts x 8 samples per rollout (--rollout_batch_size 128,
  # --num_samples 8), updates on 128 sequences (--train_batch_size 128):
  # 8 optimizer steps per rollout, one pass (--num_ppo_epochs 1).
  batch_size=128,
  group_size=8,
  minibatches=8,
  micro_batches=8,
  ppo_epochs=1,
  max_prompt_len=1024,  # --prompt_max_length
  max_new_tokens=3000,  # --generate_max_length; also (2)'s constant
  temperature=1.0,  # --temperature 1 --top_p 1
  lr=1e-6,  # --learning_rate, --lr_scheduler constant
  warmup_steps=0,
  clip_eps_low=0.2,  # oat's default --cliprange (not in the command)
  clip_eps_high=0.2,
  # The command bounds training by --num_prompt_epoch 20 (about 1250 steps
  # of 128 prompts); the step count of the released checkpoint is not in
  # it (27 h on 8 x A100, README).
  steps=1250,
  eval_every=16,  # --eval_steps 16
  checkpoint_every=50,
)


def make_batch(rollout, examples, ctx):
  """objective.make_batch, with a cut-off completion's reward 0 when
  --zero_truncated (the `reward/` parts keep the verifier's scores)."""
  if not ctx.cfg.zero_truncated:
    return objective.make_batch(rollout, examples, ctx)
  total, parts = ctx.score(rollout, examples)
  total = objective.zero_truncated(total, rollout)
  return objective.outcome_batch(rollout, examples, ctx, rewards=(total, parts))


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="dr_grpo",
    title="Dr. GRPO (arXiv:2503.20783)",
    make_batch=make_batch,  # (1)
    loss_fn=objective.loss_fn,  # (2), (3)
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
