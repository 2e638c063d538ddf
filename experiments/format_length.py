r"""Format-Length: RL for math without ground-truth answers.

Paper: Xin et al. 2025, "Surrogate Signals from Format and Length:
Reinforcement Learning for Solving Mathematical Problems without Ground
Truth Answers", arXiv:2505.19439. Authors' code: insightLLM/rl-without-gt.
Differs from experiments/grpo.py in exactly:
  (1) no ground truth: the reward is a format score, 0.5 for a closed
      <think>...</think> block plus 0.5 for an extractable final answer
      (rewards/label_free.py `format_length`; the authors' answer check
      also parses the answer with sympy, ours extracts and pre-filters);
  (2) format only for the first --format_only_steps steps (the paper: the
      first ~15 steps learn the format and bring most of the gain), then
      format + length: with an answer, R = format + f(L / Lmax); without
      one, R = min(0, f); f rises to 1 at L = p * Lmax (p = 0.5) and falls
      to -1 at Lmax (`length_score`, the authors' length_reward_func_v3);
      --format_only_steps=0 is the authors' released reward (format +
      length throughout), --length_weight=0 the Format-Only baseline;
  (3) KL 0.001 (low_var_kl, k3), 8 samples at temperature 0.6, one update
      per batch (the authors' run_grpo_math_7b.sh).
The gold answers are read only for the logged `accuracy`, unless
--reward_mode=correctness: the paper's Correctness baseline,
R = 0.5 * [think block] + [answer correct].
Laptop deviation: the tiny model answers in the R1 tags, warm-started on
the tagged arithmetic task (task:arithmetic_tags, tasks/tagged.py), and
Lmax = max_new_tokens is set so that p * Lmax sits near its solutions'
length, as p * 3072 sits near the 7B model's.

Reproduces:
  laptop: the surrogate rewards train as well as the correctness reward:
      python -m experiments.reproduce --method=format_length --seeds=0,1,2 \
        --testbed=tiny
    (format-only, format-length, and GRPO on the verifier with the same
    tagged task). Expected: format_length's accuracy close to grpo's and
    at least format_only's; measured numbers in experiments/README.md.
  paper: the README / Table 1 of the authors: Qwen2.5-Math-7B on
    DeepScaleR, AIME 2024 33.3 (40.0 with MATH-train) for Format-Length vs
    26.7 for the correctness baseline; MATH500 76.8, AMC 60.2.

CPU:  python -m experiments.format_length
TPU:  launch/tpu.sh run experiments.format_length --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --data=/data/deepscaler/train.parquet:problem,answer \
        --workdir=gs://$BUCKET/format_length/$(date +%m%d_%H%M)
"""

import dataclasses


from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.rewards import label_free
from rlreason.data.tasks import tagged

tagged.register_all()  # task:<name>_tags


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the surrogate reward; paper: PAPER."""

  data: str = "task:arithmetic_tags:difficulty=1,n=4000"
  max_new_tokens: int = 96  # Lmax: p * Lmax = 48 ~ a tagged solution
  format_only_steps: int = 15  # (2) the paper's format phase
  length_weight: float = 1.0  # (2) 0 = Format-Only
  length_peak: float = 0.5  # (2) p: the length reward peaks at p * Lmax
  kl_coef: float = 0.001  # (3)
  temperature: float = 0.6  # (3)
  reward_mode: str = "surrogate"  # surrogate | correctness (the baseline)

  def validate(self) -> None:
    super().validate()
    if self.reward_mode not in ("surrogate", "correctness"):
      raise ValueError(
        f"Invalid config: --reward_mode={self.reward_mode!r}; expected "
        "surrogate or correctness"
      )


# The authors' run_grpo_math_7b.sh and math_reward.py (the Format-Length
# branch): Qwen2.5-Math-7B, batch 128 x 8 samples, lr 1e-6, KL 0.001
# low_var_kl, temperature 0.6, 1024 + 3072 tokens, 100 steps.
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",
  # DeepScaleR's math train set (or MATH train); point --data at a copy.
  data="data/deepscaler/train.parquet:problem,answer",
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  eval_size=30,
  # R1 think/answer prompt (the authors also ran the Qwen-Math template,
  # under which the think part of the format score is always 0).
  template="r1",
  reward="math",  # only for the logged accuracy
  batch_size=128,
  group_size=8,
  minibatches=1,  # ppo_mini_batch_size 128
  micro_batches=32,
  max_prompt_len=1024,
  max_new_tokens=3072,  # Lmax of the length reward
  temperature=0.6,
  lr=1e-6,
  kl_coef=0.001,
  kl_estimator="k3",
  format_only_steps=0,  # (2) the released reward: format + length from step 0
  steps=100,
  eval_every=5,
  checkpoint_every=20,
)


def length_weight(cfg, step: int) -> float:
  """The weight of f(L) at `step` (2)."""
  return 0.0 if step < cfg.format_only_steps else cfg.length_weight


def make_batch(rollout, examples, ctx):
  """The surrogate reward (1, 2); GRPO advantages."""
  cfg = ctx.cfg
  if cfg.reward_mode == "correctness":
    correct = objective.correctness(rollout, examples, ctx)
    r = 0.5 * label_free.think_block(rollout.texts) + correct
    return objective.outcome_batch(
      rollout, examples, ctx, rewards=(r, {"correctness": r})
    )
  w = length_weight(cfg, ctx.step)
  r = label_free.format_length(
    rollout.texts,
    lengths=rollout.lengths,
    max_length=cfg.max_new_tokens,
    peak=cfg.length_peak,
    length_weight=w,
  )
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"format_length": r})
  )
  metrics["length_weight"] = w
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="format_length",
    title="Format-Length (arXiv:2505.19439)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
