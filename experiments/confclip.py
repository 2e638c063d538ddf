r"""ConfClip: confidence-weighted, clipped verifiable reward on GRPO.

Paper: Zhang et al. 2025, "ConfClip: Confidence-Weighted and Clipped Reward
for Reinforcement Learning in LLMs", arXiv:2509.17730. Differs from
experiments/grpo.py in exactly:
  (1) the reward combines the verifier's outcome o_i with the policy's own
      confidence in its answer, clipped (rewards/confidence.py):
        c_i  = exp(mean log pi(y_t) over the answer's tokens),
        r_i  = o_i (1 + w c~_i) - (1 - o_i) w c~_i,
        c~_i = clip(c_i, --conf_clip_low, --conf_clip_high), w = --conf_weight;
      so all-correct and all-wrong groups keep a within-group reward spread
      (GRPO's advantage is 0 for them under the 0/1 reward);
  (2) the scored tokens are the final answer's (--conf_tokens=answer;
      self_scoring.answer_token_mask, falling back to the whole completion
      when no answer can be extracted) or every completion token (all);
      the log-probs are the ones the sampler recorded under the untempered
      policy (no extra forward).
  What is ours, not the paper's: the abstract says the verifiable outcome is
  integrated with "the model's own confidence estimates" through a
  confidence-weighted, clipped reward; the exact formula, the confidence
  estimator and the clip range were not in any source we could reach.
  The form above (ordering-preserving: every correct reward >= 1 > 0 >=
  every wrong reward) and every constant below are assumptions, each a flag.

Reproduces:
  laptop: ConfClip vs GRPO from the same warm start:
      python -m experiments.reproduce --method=confclip --seeds=0,1,2
    Expected (paper, abstract): higher accuracy, and shorter completions
    ("reduces token consumption during inference"); `solved_all` groups
    no longer give zero gradient.
  paper: gains on several math datasets and as a plug-in to other RL
    methods (numbers not quoted in our sources).

CPU:  python -m experiments.confclip
TPU:  launch/tpu.sh run experiments.confclip --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --workdir=gs://$BUCKET/confclip/$(date +%m%d_%H%M)
"""

import dataclasses

import numpy as np

from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason import mesh as mesh_lib
from rlreason.rl import objective
from rlreason.rewards import self_scoring
from rlreason.rewards import confidence

TOKENS = ("answer", "all")


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the ConfClip reward; paper: PAPER."""

  conf_weight: float = 0.5  # (1) w, the confidence term's weight (assumed)
  conf_clip_low: float = 0.2  # (1) confidence clipped from below (assumed)
  conf_clip_high: float = 0.9  # (1) and from above (assumed)
  conf_tokens: str = "answer"  # (2) answer | all

  def validate(self) -> None:
    super().validate()
    if self.conf_tokens not in TOKENS:
      raise ValueError(
        f"Invalid config: --conf_tokens={self.conf_tokens!r}; expected one "
        f"of {TOKENS}"
      )
    if not 0 <= self.conf_clip_low <= self.conf_clip_high <= 1:
      raise ValueError(
        "Invalid config: need 0 <= --conf_clip_low <= --conf_clip_high <= 1,"
        f" got {self.conf_clip_low}, {self.conf_clip_high}"
      )
    if self.conf_weight < 0:
      raise ValueError(
        f"Invalid config: --conf_weight={self.conf_weight} must be >= 0"
      )


# The paper's model, data and batch settings are not in our sources: GRPO's
# paper preset (grpo.PAPER) is kept; the ConfClip constants above are ours.
PAPER = dict(grpo.PAPER)


def scored_tokens(rollout, ctx) -> np.ndarray:
  """[N, T] tokens whose log-probs give the confidence (2)."""
  if ctx.cfg.conf_tokens == "all":
    return mesh_lib.to_host(rollout.mask).astype(np.float32)
  sel, _ = self_scoring.answer_token_mask(
    rollout, ctx.tokenizer, fallback_fraction=1.0
  )
  return sel


def make_batch(rollout, examples, ctx):
  """Verifier outcome x clipped confidence as the reward (1); GRPO adv."""
  cfg = ctx.cfg
  correct = objective.correctness(rollout, examples, ctx)
  logp = mesh_lib.to_host(rollout.policy_logp)
  conf = confidence.confidence(logp, scored_tokens(rollout, ctx))
  r = confidence.confclip(
    correct,
    conf,
    weight=cfg.conf_weight,
    clip_low=cfg.conf_clip_low,
    clip_high=cfg.conf_clip_high,
  )
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"correct": correct})
  )
  metrics["confidence"] = conf.mean()
  for name, sel in (("correct", correct > 0), ("incorrect", correct == 0)):
    if sel.any():
      metrics[f"confidence/{name}"] = conf[sel].mean()
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="confclip",
    title="ConfClip (arXiv:2509.17730)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
