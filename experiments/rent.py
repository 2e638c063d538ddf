r"""RENT: reinforcement learning via entropy minimisation (no labels).

Paper: Prabhudesai et al. 2025, "Maximizing Confidence Alone Improves
Reasoning", arXiv:2505.22660 (project page rent-rl.github.io). Differs from
experiments/grpo.py in exactly:
  (1) no verifier: the reward of a completion is its negative mean
      per-token entropy over the selected tokens,
        r_i = - sum_t H_{i,t} s_{i,t} / sum_t s_{i,t},
      H under the policy that sampled the rollout (softmax(logits / T);
      Context.completion_scores, one extra forward in make_batch) and
      rewards/label_free.py `neg_entropy`;
  (2) the selected tokens s are all the response's tokens
      (--token_selection=all): the paper's reward averages the entropy
      over every token, as the authors' code does (entropys[i,
      :valid_response_length].mean() in its ray_trainer.py). The paper's
      analysis finds the last tokens' entropy tracks accuracy best:
      --token_selection=last_fraction (the last --last_fraction) and
      answer (the final answer's tokens, self_scoring.answer_token_mask;
      a completion without one is scored on its last fraction, so that
      not answering never earns the empty-mask reward 0) are the
      ablations.
The gold answers are read only for the logged `accuracy`.

Reproduces:
  laptop: confidence alone improves accuracy without labels; compared with
    GRPO on the verifier from the same warm start:
      python -m experiments.reproduce --method=rent --seeds=0,1,2
    Expected: held-out accuracy after RENT above the warm start's, below
    or near grpo's; `entropy` falls. Measured numbers in
    experiments/README.md.
  paper: the main results table (GSM8K, MATH500, AMC, AIME, GPQA with Qwen2.5
    and Mistral models): RENT improves every benchmark over the base model;
    the numbers are not restated here.

CPU:  python -m experiments.rent
TPU:  launch/tpu.sh run experiments.rent --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --workdir=gs://$BUCKET/rent/$(date +%m%d_%H%M)
"""

import dataclasses

import numpy as np

from experiments import grpo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason import mesh as mesh_lib
from rlreason.rl import objective
from rlreason.rewards import self_scoring
from rlreason.rewards import label_free

SELECTIONS = ("all", "last_fraction", "answer")


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the entropy reward; paper: PAPER."""

  token_selection: str = "all"  # (2) all | last_fraction | answer
  last_fraction: float = 1 / 3  # (2) the "last chunk" (and the fallback)

  def validate(self) -> None:
    super().validate()
    if self.token_selection not in SELECTIONS:
      raise ValueError(
        f"Invalid config: --token_selection={self.token_selection!r}; "
        f"expected one of {SELECTIONS}"
      )
    if not 0 < self.last_fraction <= 1:
      raise ValueError(
        f"Invalid config: --last_fraction={self.last_fraction} not in (0, 1]"
      )


# What the paper and its project page state: GRPO, Qwen2.5-Math and Mistral
# models, training on the benchmark's prompts without answers, 5 rollouts
# per prompt, temperature 1.0, 3072 new tokens. The authors' configs (as a
# mirror of their release carries them: exps/grpo.yaml, ppo_trainer.yaml)
# add lr 1e-6, a k3 KL loss of 0.001, token-mean loss, weight decay 0.01
# and verl's dual clip 3; their 500 prompts a step (mini-batch 256),
# 1024-token prompts and sampled evaluation (temperature 0.8, top-p 0.5)
# are not taken here.
_MATH500 = "hf:HuggingFaceH4/MATH-500:split=test"
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",
  data=_MATH500,  # answers unused (only logged accuracy reads them)
  eval_data=_MATH500,
  eval_size=500,
  template="boxed",
  reward="math",
  batch_size=64,  # assumption
  group_size=5,  # 5 rollouts per prompt
  minibatches=1,
  micro_batches=10,
  max_new_tokens=3072,
  temperature=1.0,
  lr=1e-6,
  kl_coef=0.001,
  aggregation="token-mean",
  weight_decay=0.01,
  dual_clip=3.0,
  steps=300,  # assumption
  eval_every=25,
)


def select_tokens(rollout, ctx):
  """[N, T] tokens whose entropy is scored (2)."""
  cfg = ctx.cfg
  mask = mesh_lib.to_host(rollout.mask).astype(np.float32)
  if cfg.token_selection == "all":
    return mask
  if cfg.token_selection == "last_fraction":
    return self_scoring.last_fraction_mask(mask, cfg.last_fraction)
  sel, _ = self_scoring.answer_token_mask(
    rollout, ctx.tokenizer, fallback_fraction=cfg.last_fraction
  )
  return sel


def make_batch(rollout, examples, ctx):
  """Negative entropy of the selected tokens as the reward (1, 2); GRPO
  advantages."""
  _, entropy = ctx.completion_scores(
    ctx.params,
    rollout.tokens,
    rollout.positions,
    rollout.prompt_len,
    with_entropy=True,
  )
  entropy = np.where(mesh_lib.to_host(rollout.mask) > 0, entropy, 0.0)
  selected = select_tokens(rollout, ctx)
  r = label_free.neg_entropy(
    rollout.texts, token_entropy=entropy, mask=selected
  )
  return objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"neg_entropy": r})
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="rent",
    title="RENT (arXiv:2505.22660)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
