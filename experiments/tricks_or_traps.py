r"""Tricks or Traps: the RL-trick ablation grid, and Lite PPO by default.

Paper: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for
LLM Reasoning", arXiv:2508.08221 (run in the ROLL framework). The paper
isolates common tricks on one critic-free PPO setup; each is a flag here:
  --adv_norm       mixed (group mean, batch std) | group (GRPO: group mean,
                   group std) | batch (batch mean, batch std) | none (group
                   mean only, Dr. GRPO)
  --clip_eps_high  clip-higher: 0.28 (DAPO) instead of 0.2
  --aggregation    token-mean (token-level) | seq-mean-token-mean
                   (sequence-level)
  --overlong_filter  drop truncated responses from the loss (their mask
                   rows; advantages are computed with them, as DAPO)
Lite PPO, the default, differs from experiments/grpo.py in exactly:
  (1) advantages: group-mean baseline divided by the BATCH std
      (advantages.batch_std_normalized, "lite_ppo");
  (2) token-level loss aggregation (token-mean);
  (3) no KL-to-reference term: a critic-free policy with the vanilla PPO
      clipped loss and nothing else.

Reproduces (paper scale): the Lite PPO vs GRPO / DAPO comparison on base
models (Qwen3-4B/8B base: Lite PPO above both on the six math benchmarks'
average; the per-benchmark numbers are not restated here) and the
single-trick ablations. Expected at laptop scale: Lite PPO's held-out
accuracy after training >= GRPO's (experiments/grpo.py, same seed budget);
each flag is one ablation cell.

CPU:  python -m experiments.tricks_or_traps                    # Lite PPO
      python -m experiments.tricks_or_traps --adv_norm=group \
          --aggregation=seq-mean-token-mean                    # GRPO, no KL
TPU:  launch/tpu.sh run experiments.tricks_or_traps --scale=paper \
        --model=/ckpt/Qwen3-8B-Base \
        --workdir=gs://$BUCKET/tricks_or_traps/$(date +%m%d_%H%M)
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from experiments import grpo
from rlreason import config
from rlreason.rl import advantages
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective

ADV_NORMS = ("mixed", "group", "batch", "none")


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.py's laptop setup with the Lite PPO preset."""

  adv_norm: str = "mixed"  # (1) Lite PPO: group mean, batch std
  aggregation: str = "token-mean"  # (2) token-level
  kl_coef: float = 0.0  # (3)
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2  # 0.28 = clip-higher
  overlong_filter: bool = False  # drop truncated responses from the loss

  def validate(self) -> None:
    super().validate()
    if self.adv_norm not in ADV_NORMS:
      raise ValueError(
        f"Invalid config: --adv_norm={self.adv_norm!r}; expected one of "
        f"{ADV_NORMS}"
      )


# The paper's setup: Qwen3-4B / 8B (base and instruct), global
# batch 1024 responses (128 prompts x 8), max response length 8192. The
# learning rate and training sets are not restated here: lr 1e-6 is
# assumed, and DAPO-Math-17k stands in for the paper's difficulty-graded
# math sets.
PAPER = dict(
  config.PAPER_COMMON,
  model="qwen3-8b",
  data="hf:BytedTsinghua-SIA/DAPO-Math-17k",
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  steps=300,
  batch_size=128,
  group_size=8,
  minibatches=4,
  micro_batches=32,
  max_prompt_len=1024,
  max_new_tokens=8192,
  lr=1e-6,
  eval_size=500,
  checkpoint_every=50,
)


def adv_fn(cfg: Config):
  """rewards [N] -> advantages [N] for cfg.adv_norm."""

  def fn(rewards):
    r = jnp.asarray(rewards, jnp.float32)
    if cfg.adv_norm == "mixed":
      out = advantages.batch_std_normalized(r, cfg.group_size, eps=cfg.std_eps)
    elif cfg.adv_norm == "group":
      out = advantages.group_normalized(r, cfg.group_size, eps=cfg.std_eps)
    elif cfg.adv_norm == "batch":  # the whole batch is one "group"
      out = advantages.batch_std_normalized(r, r.shape[0], eps=cfg.std_eps)
    else:
      out = advantages.group_normalized(r, cfg.group_size, scale_by_std=False)
    return np.asarray(out)

  return fn


def make_batch(rollout, examples, ctx):
  """(1) on whole groups; --overlong_filter masks truncated responses."""
  cfg = ctx.cfg
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, adv_fn=adv_fn(cfg)
  )
  if cfg.overlong_filter:
    kept = np.asarray(rollout.finish_reasons) != "length"
    batch["mask"] = batch["mask"] * kept[:, None].astype(np.float32)
    metrics["overlong_filtered"] = 1.0 - kept.mean()
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="tricks_or_traps",
    title=f"Tricks or Traps ({cfg.adv_norm})",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,  # (2), (3): vanilla PPO loss, cfg-bound
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
