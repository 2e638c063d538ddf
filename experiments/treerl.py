r"""TreeRL: on-policy tree search in RL, process advantages from the tree.

Paper: Hou et al. 2025, "TreeRL: LLM Reinforcement Learning with On-Policy
Tree Search", arXiv:2506.11902 (ACL 2025). Authors' code: THUDM/TreeRL.
Differs from experiments/grpo.py in exactly:
  (1) rollouts are EPTree(M, N, L, T) forests (rlreason/sampling/tree.py):
      M = G / (1 + L * N * T) chains per prompt, then L = --fork_levels
      rounds, each forking every tree at its N = --forks highest-entropy
      tokens pooled over all the tree's chains so far into T =
      --fork_branches new chains; a branch reuses its parent's KV cache up
      to the fork and resamples from there (G = M * (1 + L * N * T));
  (2) advantages are per segment, from subtree outcomes (Sec. 3.2):
      A(s) = [(V(s) - V(root)) + (V(s) - V(parent))] / sqrt(|L(s)|),
      V = mean verifier reward of the leaves below s
      (tree_credit.tree_advantages), no std normalisation (the paper's
      form; the authors' code divides each node's value by the root of its
      own leaf count, 2 V(s) / sqrt|L(s)| - V(parent) / sqrt|L(parent)|,
      with leave-one-out centred V, which this does not follow);
  (3) every leaf's root-to-leaf path counts as a row, as in the authors'
      code (THUDM/TreeRL: each path a row, averaged over its tokens):
      here a token is trained once, in the row that sampled it (a branch's
      shared prefix is masked in the branch row), weighted by
      sum_{l in L(s)} 1 / |path_l|, and the loss sums tokens over rows
      (aggregation seq-mean-token-sum): the same loss as the leaf rows'
      (tree_credit.tree_advantages' path_lengths). --train_leaves=K trains
      K leaves' paths per prompt, as the authors (16 of 30: PAPER): one
      correct leaf when there is one, the rest at random
      (tree_credit.select_leaves); V(s) still counts every leaf, and the
      weights are scaled by G / K so that the sum over tokens / rows is
      the mean over the B * K trained paths (tokens on no trained path
      keep their mask, at advantage 0); 0 (the laptop's) trains all;
  (4) no KL term (assumed, as the authors' GRPO-style baseline without KL).
`--fork_at=depth --fork_depths=...` forks at fixed depths instead (the
paper's random / fixed-position ablation).

Reproduces (paper scale, not run here): Table 1, TreeRL vs ChainRL
(multi-chain sampling) on Qwen-2.5-14B / R1-Distill-Qwen-7B, math and code
benchmarks (numbers not restated: assumed). Laptop expectation:
reproduce.CLAIMS["treerl"]: entropy-forked trees reach at least GRPO's
held-out accuracy at the same number of leaves per prompt.

CPU:  python -m experiments.treerl
TPU:  launch/tpu.sh run experiments.treerl --scale=paper \
        --workdir=gs://$BUCKET/treerl/$(date +%m%d_%H%M)
"""

import dataclasses

import numpy as np

from experiments import grpo
from rlreason import config
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.sampling import tree_loop
from rlreason.rl import tree_credit


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale; the paper's values are in PAPER below."""

  group_size: int = 8  # (1) leaves per prompt: M * (1 + L * N * T)
  forks: int = 1  # (1) N, fork points per tree and round
  # (1) L, expansion rounds; 1 at laptop scale (the paper's training
  # setting too), 2+ grows branches of branches.
  fork_levels: int = 1
  fork_branches: int = 1  # (1) T, chains sampled from each fork point
  fork_at: str = "entropy"  # (1) entropy | depth
  fork_depths: str = "8"  # comma-separated depths for --fork_at=depth
  # (3) leaves whose paths train per prompt, one correct kept; 0 = all
  train_leaves: int = 0
  kl_coef: float = 0.0  # (4)
  # (3) sum over tokens / rows: with the path weights, the leaf rows' mean
  aggregation: str = "seq-mean-token-sum"

  def validate(self) -> None:
    super().validate()
    config.require(
      self.fork_at in ("entropy", "depth"),
      f"--fork_at={self.fork_at!r}; expected entropy or depth",
    )
    tree_loop.check_shape(self)
    config.require(
      0 <= self.train_leaves <= self.group_size,
      f"--train_leaves={self.train_leaves} must be in [0, --group_size="
      f"{self.group_size}]",
    )


PAPER = dict(
  config.PAPER_COMMON,
  model="deepseek-r1-distill-qwen-7b",  # one of the paper's policies
  data="hf:openai/gsm8k:config=main",  # assumed (paper: MATH-style mix)
  eval_data="hf:openai/gsm8k:config=main,split=test",
  steps=300,  # assumed
  batch_size=16,  # 480 sequences / 30 leaves (below)
  # EPTree (M, N, L, T) = (6, 2, 1, 2): 30 leaves per prompt, the paper's
  # RL setting (16 prompts x 30 leaves = its batch of 480).
  group_size=30,
  forks=2,
  fork_levels=1,
  fork_branches=2,
  # assumed: a GSM8K question in the template (grpo.TinyConfig's 32 tokens
  # would refuse any real one: padding.pad_prompts)
  max_prompt_len=512,
  max_new_tokens=4096,  # assumed
  # 32 rows of 4k tokens per micro-batch (the planner's: with one micro-
  # batch of 480 rows the train step needed 155 GB of temporaries per chip
  # on v5p-16; with 15 it takes 40.6 GB on v5p-8).
  micro_batches=15,
  # scripts/treerl-qw14b.sh (as a fork carries it): lr 1.5e-6 cosine,
  # weight decay 0.1, temperature 1.2, top-p 0.95, no KL, 16 of the 30
  # leaves trained (NUM_TRACE); its 8192-token responses are not taken here.
  aggregation="seq-mean-token-sum",  # (3)
  train_leaves=16,  # (3)
  lr=1.5e-6,
  schedule="cosine",
  weight_decay=0.1,
  temperature=1.2,
  top_p=0.95,
  kl_coef=0.0,
)


def generate_fn(cfg: Config):
  depths = tuple(int(d) for d in cfg.fork_depths.split(",") if d)
  return tree_loop.make_generate_fn(cfg, fork_at=cfg.fork_at, depths=depths)


def make_batch(rollout, examples, ctx):
  """(2): tree advantages of the verifier's rewards; (3): owned tokens,
  weighted by the (trained) leaves' paths they lie on."""
  cfg = ctx.cfg
  trained, scale = None, 1.0
  if cfg.train_leaves:  # (3) the authors' subset, drawn per step
    rng = np.random.default_rng((cfg.seed, ctx.step, 0x7EE))
    trained = tree_credit.select_leaves(
      objective.correctness(rollout, examples, ctx),
      rollout.prompt_ids,
      cfg.train_leaves,
      rng,
    )
    scale = cfg.group_size / cfg.train_leaves

  def adv_fn(rewards):
    return scale * tree_credit.tree_advantages(
      rewards,
      rollout.parent,
      rollout.fork_col,
      np.asarray(rollout.mask),
      rollout.prompt_ids,
      path_lengths=np.asarray(rollout.mask_full).sum(-1),  # (3)
      trained=trained,
    )

  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, adv_fn=adv_fn
  )
  metrics["fork_col"] = rollout.fork_col[rollout.parent >= 0].mean()
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="treerl",
    title="TreeRL (entropy-forked tree rollouts)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
    generate_fn=generate_fn(cfg),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
