r"""SIREN: selective, self-anchored entropy regularisation.

Paper: 2025, "Rethinking Entropy Regularization in Large
Reasoning Models", arXiv:2509.25133. Authors' code: Linn3a/siren (verl;
exp_scripts/siren.sh and workers/actor/dp_actor.py are the reference for
the details below). Built on the authors' GRPO baseline (no std in the
advantage, seq-mean-token-sum-norm aggregation, clip 0.28, no KL). Differs
from that baseline in exactly:
  (1) an entropy regulariser on the policy's top-p head only: H^p_t, the
      entropy of the renormalised top-p (0.8) tokens of pi(. | s_t)
      (entropy_reg.nucleus_entropy), so the bonus cannot spread mass over
      the vocabulary's long tail (their "entropy explosion");
  (2) on each sequence's peak-entropy positions only: H^p above the
      sequence's 80th percentile (entropy_reg.peak_entropy_mask);
  (3) self-anchored: the loss adds coef * (Hbar - H_anchor)^2 with Hbar the
      masked H^p (seq-mean-token-mean) and H_anchor the same statistic of
      the initial policy on the first batch (written to the workdir as
      siren_anchor.json, reused on resume), coef = 0.005; the entropy is
      held where it started rather than pushed up.
Ablations: --siren_top_p=1.0 (no top-p mask), --siren_quantile=0 (every
token but each sequence's lowest), --self_anchored=false (plain bonus
-coef * Hbar on the masked nucleus entropy, the authors' abla_wo_anchor).
The regulariser's statistics are per micro-batch (as the authors'), each
micro-batch adding its share of the minibatch's sequences of the term.

Reproduces (paper scale): Qwen2.5-Math-7B, +6.6 maj@k on AIME24/25 over
prior entropy-regularised RLVR (abstract), with entropy held near its
initial level and validation pass@k preserved. Expected at laptop scale:
entropy stays near its initial value (metric siren/h_bar vs siren/anchor)
where the no-anchor ablation drifts, at accuracy no worse than GRPO's.

CPU:  python -m experiments.siren
TPU:  launch/tpu.sh run experiments.siren --scale=paper \
        --data=/data/openr1_math_46k.parquet \
        --workdir=gs://$BUCKET/siren/$(date +%m%d_%H%M)
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from experiments import grpo
from rlreason import config
from rlreason.rl import aggregation
from rlreason.rl import entropy_reg
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.train import run_info
from rlreason import mesh as mesh_lib
from rlreason.rl import objective
from rlreason import storage

NAME = "siren"


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.py's laptop setup; the authors' baseline plus the regulariser."""

  # The authors' GRPO baseline (exp_scripts/siren.sh).
  advantage: str = "dr_grpo"  # norm_adv_by_std_in_grpo=False
  aggregation: str = "seq-mean-token-sum-norm"
  clip_eps_low: float = 0.28  # clip_ratio=0.28, both sides
  clip_eps_high: float = 0.28
  kl_coef: float = 0.0
  # (1)-(3) the regulariser.
  siren_coef: float = 0.005  # entropy_coeff
  siren_top_p: float = 0.8  # (1) entropy_topp
  siren_quantile: float = 0.8  # (2) mask_ratio
  self_anchored: bool = True  # (3) hold the entropy at its start

  def validate(self) -> None:
    super().validate()
    if not 0 < self.siren_top_p <= 1:
      raise ValueError(f"Invalid config: --siren_top_p={self.siren_top_p}")
    if not 0 <= self.siren_quantile < 1:
      raise ValueError(
        f"Invalid config: --siren_quantile={self.siren_quantile}"
      )


# exp_scripts/siren.sh: Qwen2.5-Math-7B on Elliott/Openr1-Math-46k-8192,
# 128 prompts x 8 responses, mini-batch 8 prompts (16 updates per step),
# lr 1e-6 with 5 warmup steps, weight decay 0.1, prompt 1024 / response
# 3072 tokens, temperature 1, 2 epochs; validation samples 16 at
# temperature 0.6, top-p 0.7 (maj@16 / pass@16).
PAPER = dict(
  config.PAPER_COMMON,
  model="qwen2.5-math-7b",
  data="hf:Elliott/Openr1-Math-46k-8192",
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  steps=720,  # 2 epochs of 46k prompts at 128 per step
  batch_size=128,
  group_size=8,
  minibatches=16,
  micro_batches=8,
  max_prompt_len=1024,
  max_new_tokens=3072,
  lr=1e-6,
  warmup_steps=5 * 16,  # 5 rollout steps of 16 updates (verl counts steps)
  weight_decay=0.1,
  # verl's compute_policy_loss applies its default clip_ratio_c of 3.
  dual_clip=3.0,
  eval_size=30,
  eval_samples=16,
  checkpoint_every=20,
)


def _anchor(rollout, ctx) -> float:
  """H_anchor: the initial policy's statistic, computed once per run."""
  cfg = ctx.cfg
  path = epath.Path(run_info.workdir_for(cfg, NAME)) / "siren_anchor.json"
  saved = storage.read_json(path)  # a resumed run keeps its anchor
  if saved is not None:
    return float(saved["anchor"])
  # The first batch under the policy that sampled it: the initial policy.
  (h,) = ctx.per_token(
    rollout, (entropy_reg.nucleus_entropy_fn(cfg.siren_top_p),)
  )
  mask = mesh_lib.to_host(rollout.mask)
  peak = entropy_reg.peak_entropy_mask(h, mask, quantile=cfg.siren_quantile)
  anchor = float(aggregation.aggregate(h, peak, "seq-mean-token-mean"))
  if jax.process_index() == 0:
    path.write_text(json.dumps({"anchor": anchor}))
  return anchor


def train_fields(cfg: Config) -> dict:
  """Per-row shapes of the batch fields the loss reads beyond
  objective.loss_fn's (the planner's abstract batch, experiments/plan.py)."""
  return {"entropy_anchor": ()} if cfg.self_anchored else {}


def make_batch(rollout, examples, ctx):
  batch, metrics = objective.make_batch(rollout, examples, ctx)
  if ctx.cfg.self_anchored:
    anchor = _anchor(rollout, ctx)
    batch["entropy_anchor"] = np.full(len(batch["mask"]), anchor, np.float32)
    metrics["siren/anchor"] = anchor
  return batch, metrics


def loss_fn(params, batch, norm, *, cfg: Config, model_cfg):
  """The baseline's loss + the selective, anchored entropy term."""
  mask = batch["mask"]
  logp, entropy, h = objective.completion_forward(  # h: (1)
    params,
    batch,
    cfg=cfg,
    model_cfg=model_cfg,
    per_token=(lambda z, _: entropy_reg.nucleus_entropy(z, cfg.siren_top_p),),
  )
  loss, metrics = objective.pg_loss(
    params,
    batch,
    norm,
    cfg=cfg,
    model_cfg=model_cfg,
    forward=(logp, entropy),
  )
  peak = entropy_reg.peak_entropy_mask(h, mask, quantile=cfg.siren_quantile)
  if cfg.self_anchored:  # (3)
    reg, h_bar = entropy_reg.anchored_entropy_penalty(
      h, peak, jnp.mean(batch["entropy_anchor"]), coef=cfg.siren_coef
    )
  else:  # a plain bonus on the masked nucleus entropy
    _, h_bar = entropy_reg.anchored_entropy_penalty(h, peak, 0.0, coef=0.0)
    reg = -cfg.siren_coef * h_bar
  metrics.update({"siren/h_bar": h_bar, "siren/reg": reg})
  # The micro-batches' losses are summed: each adds its share of the
  # minibatch's sequences of the term (the authors weight each micro-batch
  # by len(data) / ppo_mini_batch_size), so the term counts once.
  share = jnp.sum(jnp.any(mask > 0, -1)) / jnp.maximum(norm["num_seqs"], 1.0)
  return loss + share * reg, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name=NAME,
    title="SIREN",
    make_batch=make_batch,
    loss_fn=loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
