r"""EMPO: semantic-entropy minimisation on unlabeled prompts.

Paper: Zhang et al. 2025, "Right Question is Already Half the Answer: Fully
Unsupervised LLM Reasoning Incentivization", arXiv:2504.05812. Differs
from experiments/grpo.py in exactly:
  (1) no labels: the G answers of a prompt are clustered by meaning and a
      completion's reward is the frequency of its cluster, r_i = |c(i)| /
      G (a completion without an answer is a cluster of its own, 1 / G,
      as in the authors' code), so the policy is pushed to concentrate on
      its most common meaning: minimising the semantic entropy
      H = -sum_k p(c_k) log p(c_k) (rewards/semantic.py);
  (2) meaning = equivalence of final answers: exact after normalisation
      for procedural tasks, Math-Verify equivalence for math answers
      (--equivalence=math, pairs of distinct answers checked in the
      verifier pool), not an NLI model (the paper's choice for free-form
      text);
  (3) entropy thresholding: prompts whose semantic entropy is at or above
      --entropy_max (too uncertain for a reliable target) or below
      --entropy_min (too sure to teach anything) are dropped from the
      update (mask and advantage zeroed); 0 = off. The authors' math
      reward (src/open_r1/rewards.py) keeps H < ln G: it drops a group
      only when its G answers all differ; PAPER does the same.
The gold answers are read only for the logged `accuracy`. The logged
empo/semantic_entropy is the mean H of the batch's prompts.

Reproduces:
  laptop: semantic-entropy minimisation improves accuracy without labels,
    compared with GRPO on the verifier:
      python -m experiments.reproduce --method=empo --seeds=0,1,2
    Expected: empo's held-out accuracy above the warm start's, near grpo's;
    empo/semantic_entropy falls. Measured numbers in experiments/README.md.
  paper: Qwen2.5-Math-7B base, math average 30.7% -> 48.1% (abstract);
    Qwen2.5-7B-Instruct TruthfulQA 87.16% -> 97.25% (free-form, not here).

CPU:  python -m experiments.empo
TPU:  launch/tpu.sh run experiments.empo --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --data=/data/numina_20k.parquet:problem,answer \
        --workdir=gs://$BUCKET/empo/$(date +%m%d_%H%M)
"""

import dataclasses
import math

import numpy as np

from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.data import extract
from rlreason.rewards import semantic


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the EMPO reward; paper: PAPER."""

  equivalence: str = "exact"  # (2) exact | math
  entropy_max: float = 0.0  # (3) drop prompts with H >= this; 0 = off
  entropy_min: float = 0.0  # (3) drop prompts with H < this; 0 = off

  def validate(self) -> None:
    super().validate()
    if self.equivalence not in ("exact", "math"):
      raise ValueError(
        f"Invalid config: --equivalence={self.equivalence!r}; expected "
        "exact or math"
      )
    if self.entropy_max < 0 or self.entropy_min < 0:
      raise ValueError(
        "Invalid config: --entropy_max and --entropy_min must be >= 0"
      )
    if self.entropy_max and self.entropy_min >= self.entropy_max:
      raise ValueError(
        f"Invalid config: --entropy_min={self.entropy_min} keeps no prompt "
        f"below --entropy_max={self.entropy_max}"
      )


# What the abstract states: Qwen2.5-Math-7B base, unlabeled math prompts,
# GRPO. Not restated here, so assumptions: the prompt set (a 20K
# NuminaMath-CoT subset is assumed), batch, samples, lr and the response
# length. The KL term is grpo.PAPER's (0.04, k3, in the loss); the
# authors' later configs (TRL config_EMPO_NM_COT_20K_1.5B.yaml, the
# verl-empo scripts) set it to 0: pass --kl_coef=0 to follow them.
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",
  data="data/numina_20k.parquet:problem,answer",  # answers unused
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  eval_size=500,
  template="boxed",
  reward="math",  # only for the logged accuracy
  equivalence="math",  # (2)
  # (3) ln G for G = 8: the authors' code's bound (set it again with
  # another --group_size).
  entropy_max=math.log(8),
  batch_size=128,  # assumption
  group_size=8,  # assumption
  minibatches=2,
  micro_batches=16,
  max_new_tokens=3072,
  lr=1e-6,  # assumption
  steps=300,  # assumption
  eval_every=25,
)


def make_batch(rollout, examples, ctx):
  """Cluster-frequency rewards (1, 2); entropy thresholding (3)."""
  cfg = ctx.cfg
  g = cfg.group_size
  equivalent = semantic.exact_equivalence
  if cfg.equivalence == "math":
    equivalent = semantic.math_equivalence
  answers = [extract.extract(t) for t in rollout.texts]
  ids = semantic.cluster_ids(answers, g, equivalent)
  r = semantic.cluster_probabilities(ids, g)
  entropy = semantic.semantic_entropy(ids, g)
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"semantic_cluster": r})
  )
  metrics["empo/semantic_entropy"] = float(entropy.mean())
  if cfg.entropy_max > 0 or cfg.entropy_min > 0:
    # 1e-6: a float32 H of G distinct answers may round a hair below ln G.
    high = cfg.entropy_max - 1e-6 if cfg.entropy_max else np.inf
    keep = semantic.entropy_band(entropy, low=cfg.entropy_min, high=high)
    batch = objective.drop_groups(batch, keep, g)
    metrics["empo/kept"] = float(keep.mean())
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="empo",
    title="EMPO (arXiv:2504.05812)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
