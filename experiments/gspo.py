r"""GSPO: group sequence policy optimisation.

Paper: Zheng et al. 2025 (Qwen team), "Group Sequence Policy Optimization",
arXiv:2507.18071. Differs from experiments/grpo.py in exactly:
  (1) the importance ratio is the sequence's, length-normalised:
      s_i = (pi(y_i | x) / pi_old(y_i | x))^(1 / |y_i|), and clipping acts
      on s_i (whole completions are clipped, not tokens; losses.gspo);
  (2) its clip range is tiny, [1 - 3e-4, 1 + 4e-4] (Sec. 5), since s_i is
      a geometric mean of token ratios;
  (3) every rollout batch is split into 4 minibatches (Sec. 5), so the
      policy moves off the sampling one and the ratio matters;
  (4) no KL term (the GSPO objective, Eq. 5, has none).
  The advantage stays GRPO's group-normalised reward, and the objective
  averages over completions ("seq-mean-token-mean"), as Eq. 5.

Reproduces:
  laptop: the paper's clipping claim (Sec. 5, the clip-fraction
    figure): GSPO clips about two orders of magnitude more tokens than GRPO
    yet learns at least as efficiently:
      python -m experiments.reproduce --method=gspo --seeds=0,1,2
    (this file vs experiments/grpo.py with 4 minibatches and the paper's
    GRPO clip 0.2 / 0.27). Expected: clipfrac far higher for GSPO, train
    accuracy not lower; measured numbers in experiments/README.md.
  paper: Fig. 1, training reward and AIME'24 / LiveCodeBench / CodeForces
    curves of a cold-start Qwen3-30B-A3B-Base: GSPO above GRPO throughout
    (curves only; the paper gives no table).

CPU:  python -m experiments.gspo
TPU:  launch/tpu.sh run experiments.gspo --scale=paper \
        --model=/ckpt/Qwen3-8B-Base --data=/data/your_rl_prompts.jsonl \
        --workdir=gs://$BUCKET/gspo/$(date +%m%d_%H%M)
"""

import dataclasses

from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with GSPO's objective; paper: PAPER."""

  policy_loss: str = "gspo"  # (1) sequence-level ratio and clipping
  clip_eps_low: float = 3e-4  # (2) Sec. 5
  clip_eps_high: float = 4e-4  # (2) Sec. 5
  minibatches: int = 4  # (3) Sec. 5
  kl_coef: float = 0.0  # (4)
  aggregation: str = "seq-mean-token-mean"  # mean over completions, Eq. 5


# Public: the clip range and the 4 minibatches (Sec. 5). Not public: the
# RL data, batch size, group size, learning rate and lengths of the Qwen3
# runs. The paper trains a cold-start fine-tune of Qwen3-30B-A3B-Base, a
# mixture of experts, which this codebase's model does not implement; the
# paper scale here is a dense Qwen3-8B on DAPO-Math-17k with DAPO's sizes
# (experiments/dapo.py), so only (1)-(4) are the paper's.
PAPER = dict(
  grpo.PAPER,
  model="qwen3-8b",
  data="hf:BytedTsinghua-SIA/DAPO-Math-17k",
  eval_data="hf:BytedTsinghua-SIA/AIME-2024",
  eval_size=30,
  eval_samples=32,
  template="chat",
  reward="math",
  batch_size=512,
  group_size=16,
  minibatches=4,  # (3)
  micro_batches=32,
  max_prompt_len=2048,
  max_new_tokens=16384,
  lr=1e-6,
  warmup_steps=0,
  steps=1000,
  eval_every=50,
  checkpoint_every=20,
)


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="gspo",
    title="GSPO (arXiv:2507.18071)",
    make_batch=objective.make_batch,
    loss_fn=objective.loss_fn,  # (1), (2), (4)
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
