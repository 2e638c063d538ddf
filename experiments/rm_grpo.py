r"""GRPO on a learned reward model beside the verifier: RLHF's proxy reward.

Papers: the reward model of InstructGPT (Ouyang et al. 2022, "Training
language models to follow instructions with human feedback",
arXiv:2203.02155, Sec. 3.5): a scalar head on the SFT model, trained on
comparisons with the Bradley-Terry loss -log sigmoid(r(y_w) - r(y_l)),
then optimised by RL. Gao et al. 2022, "Scaling Laws for Reward Model
Overoptimization", arXiv:2210.10760: optimising a learned proxy RM makes
the proxy score rise monotonically while the gold score (here: the
verifier) first rises, then stalls or falls (Goodhart).
Differs from experiments/grpo.py in exactly:
  (1) a reward-model stage before RL (train/reward_model.py): the
      warm-start policy samples --rm_samples completions for each of
      --rm_prompts training prompts; the verifier labels them; preference
      pairs (chosen = a correct sample, rejected = an incorrect one of the
      same prompt, up to --rm_pairs_per_prompt per prompt;
      rewards/bradley_terry.py's preference_pairs) train a scalar-head RM
      initialised from the warm-start policy (as InstructGPT's from the
      SFT model) with the Bradley-Terry loss for --rm_steps steps of
      --rm_batch_size pairs at --rm_lr (--rm_schedule=cosine:
      InstructGPT's decay to a tenth; bradley_terry.train_bt;
      --rm_micro_batches accumulates a step's gradient over that many
      micro-batches of them: the same step, less memory), batched as
      InstructGPT's (Sec. 3.5): all of a prompt's pairs in one step, each
      prompt weighted alike (--rm_batching=prompt; `pairs` draws pairs
      one by one, each alike). Its pairwise accuracy on the pairs of
      --rm_heldout held-out prompts goes to reward_model.json in the
      workdir. The RM is cached under --cache_dir by its settings: a
      resumed run, or another variant, does not retrain it; a run stopped
      while the RM trains keeps its samples (<cache>/rm-<key>.partial), so
      the rerun samples none, and SIGTERM checkpoints the Bradley-Terry
      steps there (resumed);
  (2) the reward r = w * r_RM + (1 - w) * r_verifier, w = --rm_weight,
      r_RM = (RM score - mu) / sigma with mu, sigma the mean and std of the
      RM's scores on its own training samples (InstructGPT shifts its RM
      so demonstrations score 0 on average; the scale is ours, assumed),
      so that w mixes comparable units. w = 1: the RM alone; w = 0: GRPO;
  (3) each step logs the proxy `reward/rm`, the gold `accuracy` (verifier)
      and `rm/pair_accuracy`: the RM's ranking accuracy on the current
      batch's correct-vs-incorrect pairs, i.e. how well the proxy still
      tracks the gold on the moving policy's samples.
`--rm_kind=judge` replaces the trained RM by the generative judge
(rewards/judge.judge, verdict "yes" = 1): the frozen warm-start policy, or
the HF checkpoint --judge_model, asked whether the response is correct
(--judge_samples verdicts, sampled on the run's mesh as the policy's
rollouts are); no training stage. (The tiny laptop policy was never
taught to judge: at laptop scale this only exercises the mechanism.)

Reproduces:
  laptop: reward over-optimisation on the arithmetic task:
      python -m experiments.reproduce --method=rm_grpo --seeds=0,1
    Expected (Gao et al. 2022): under the RM alone `reward/rm` keeps
    rising while `accuracy` (the verifier) rises less than grpo's, then
    stalls or falls; the mixed reward stays close to grpo's accuracy.
    Measured numbers in experiments/README.md.
  paper: InstructGPT's 6B RM and PPO results, and Gao et al.'s gold-vs-
    proxy score curves against the KL to the initial policy (Fig. 1); the
    numbers are not restated here.

CPU:  python -m experiments.rm_grpo
TPU:  launch/tpu.sh run experiments.rm_grpo --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --workdir=gs://$BUCKET/rm_grpo/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar
import functools

import jax
import numpy as np
from etils import epath

from experiments import grpo
from rlreason.train import context as context_lib
from rlreason.train import loaders
from rlreason.train import flags as rr_flags
from rlreason.train import preflight
from rlreason.train import loop
from rlreason import mesh as mesh_lib
from rlreason.rl import objective
from rlreason.train import reward_model as rm_stage
from rlreason.train import sft
from rlreason import storage
from rlreason.rewards import bradley_terry as bt
from rlreason.rewards import judge as judge_lib
from rlreason.rewards import model as rm
from rlreason.model import transformer

KINDS = ("scalar", "judge")


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the RM reward; paper: PAPER."""

  model_fields: ClassVar = {"judge_model": (("",), False)}
  # Runs recorded before --rm_batching drew the pairs one by one.
  absent_means: ClassVar[dict[str, object]] = {"rm_batching": "pairs"}

  rm_kind: str = "scalar"  # scalar (trained, (1)) | judge (generative)
  # (2) w, the reward model's share: r = w * r_RM + (1 - w) * r_verifier
  rm_weight: float = 1.0
  # (1) Preference data from the warm-start policy's samples (assumed
  # sizes; InstructGPT ranks K = 4..9 responses per prompt).
  rm_prompts: int = 256
  rm_samples: int = 8  # (1) responses sampled per preference prompt
  rm_pairs_per_prompt: int = 4  # (1) preference pairs drawn from them
  # (1) prompt: a prompt's pairs in one step, each prompt weighted alike
  # (InstructGPT); pairs: pairs shuffled one by one, each weighted alike
  rm_batching: str = "prompt"
  rm_heldout: float = 0.25  # fraction of the prompts held out
  # (1) Bradley-Terry training (assumed: several epochs over the pairs;
  # InstructGPT trains one epoch, more overfit its 6B RM). At 300 steps,
  # lr 1e-4 / 3e-4 held out worse than 1e-3 (pairwise 0.47-0.55 vs 0.61,
  # seed 0): the tiny RM is a weak proxy, as Gao et al.'s small RMs.
  rm_steps: int = 300
  rm_batch_size: int = 32  # pairs per step
  # Each step's pairs in this many gradient-accumulation micro-batches:
  # the same update (to rounding), a fraction of the activations live.
  rm_micro_batches: int = 1
  rm_lr: float = 1e-3  # (1) the reward model's learning rate
  # (1) its schedule over --rm_steps: constant | cosine (InstructGPT's:
  # down to 10% of --rm_lr by the last step)
  rm_schedule: str = "constant"
  # --rm_kind=judge: "" = the warm-start policy judges; else an HF dir.
  judge_model: str = ""
  judge_samples: int = 1  # verdicts per response (mean)
  judge_temperature: float = 0.0  # greedy verdicts

  def validate(self) -> None:
    super().validate()
    if self.rm_kind not in KINDS:
      raise ValueError(
        f"Invalid config: --rm_kind={self.rm_kind!r}; expected one of {KINDS}"
      )
    if not 0 <= self.rm_weight <= 1:
      raise ValueError(
        f"Invalid config: --rm_weight={self.rm_weight} not in [0, 1]"
      )
    if self.rm_samples < 2 or self.rm_prompts < 2:
      raise ValueError(
        "Invalid config: --rm_samples and --rm_prompts must be >= 2 "
        "(pairs compare samples of one prompt; some prompts are held out)"
      )
    if not 0 < self.rm_heldout < 1:
      raise ValueError(
        f"Invalid config: --rm_heldout={self.rm_heldout} not in (0, 1)"
      )
    if min(self.rm_steps, self.rm_batch_size, self.rm_pairs_per_prompt) < 0:
      raise ValueError("Invalid config: negative --rm_* size")
    if self.rm_schedule not in bt.SCHEDULES:
      raise ValueError(
        f"Invalid config: --rm_schedule={self.rm_schedule!r}; expected one "
        f"of {bt.SCHEDULES}"
      )
    if self.rm_batching not in ("prompt", "pairs"):
      raise ValueError(
        f"Invalid config: --rm_batching={self.rm_batching!r}; expected "
        "'prompt' or 'pairs'"
      )
    if self.rm_batching == "prompt" and (
      self.rm_pairs_per_prompt > self.rm_batch_size
    ):
      raise ValueError(
        f"Invalid config: --rm_pairs_per_prompt={self.rm_pairs_per_prompt} "
        f"exceeds --rm_batch_size={self.rm_batch_size}: with "
        "--rm_batching=prompt a prompt's pairs share one step"
      )
    if self.rm_micro_batches < 1 or self.rm_batch_size % self.rm_micro_batches:
      raise ValueError(
        f"Invalid config: --rm_micro_batches={self.rm_micro_batches} must "
        f"be >= 1 and divide --rm_batch_size={self.rm_batch_size}"
      )


PAPER = dict(
  grpo.PAPER,
  # (1) InstructGPT's 6B RM (App. C): lr 9e-6, cosine to 10% of it by the
  # end. Assumed: preference data from the policy's own samples on the
  # training prompts (K = 8; every correct-vs-incorrect pair, at most 16);
  # a step of 64 pairs, whole prompts (4 to 64 of them), 500 steps.
  # InstructGPT's batch is 64 prompts with all their comparisons (up to
  # 2,304), for one epoch: a step that size changes the planned programs
  # (the README's planning table).
  rm_prompts=4096,
  rm_samples=8,
  rm_pairs_per_prompt=16,
  rm_steps=500,
  rm_batch_size=64,
  rm_lr=9e-6,
  rm_schedule="cosine",
)


def scorers(cfg) -> dict:
  """The scalar reward model for the planner (experiments/plan.py): the
  warm-started policy's architecture with a scalar head, its forward a
  program, its weights resident beside the others (the generative judge:
  `samplers`)."""
  return {"reward_model": cfg.model} if cfg.rm_kind == "scalar" else {}


def samplers(cfg) -> dict:
  """The planner's other sampler (experiments/plan.py): --rm_kind=judge's
  judge (the warm-start policy's architecture, or --judge_model's)
  sampling --judge_samples verdicts of judge.MAX_NEW_TOKENS tokens for
  each of the N responses, each prompted with its question and response
  (judge.prompt_len), as the run's sampler calls run (Context.sampler_
  kwargs)."""
  if cfg.rm_kind != "judge":
    return {}
  return {
    "judge": dataclasses.replace(
      cfg,
      model=cfg.judge_model or cfg.model,
      max_prompt_len=judge_lib.prompt_len(
        cfg.max_prompt_len, cfg.max_new_tokens
      ),
      max_new_tokens=judge_lib.MAX_NEW_TOKENS,
      batch_size=cfg.num_sequences,
      group_size=cfg.judge_samples,
      temperature=cfg.judge_temperature,
    )
  }


def reward_model_pairs(cfg) -> int:
  """The planner's reward-model training before the RL (rm_stage's:
  --rm_steps Bradley-Terry steps of --rm_batch_size pairs, in
  --rm_micro_batches micro-batches, which the planner reads from the
  config); 0 without it (a judge, or no steps)."""
  if cfg.rm_kind != "scalar" or cfg.rm_steps <= 0:
    return 0
  return cfg.rm_batch_size


def scalar_reward(rm_params, info, model_cfg):
  """(2) The RM's standardised score of each rollout row."""
  mu, sigma = info["score_mean"], info["score_std"] or 1.0

  def fn(rollout, examples, ctx):
    del examples
    with ctx.scoring():  # as ctx.ref_logp: --score_temp_budget_mib
      s = rm.score_rollout(
        rm_params, rollout, model_cfg, rows=ctx.score_rows, mesh=ctx.mesh
      )
    return ((s - mu) / sigma).astype(np.float32)

  return fn


def judge_reward(cfg, mesh):
  """--rm_kind=judge: the generative judge's mean verdict in [0, 1]."""
  jcfg = cfg
  if cfg.judge_model:
    jcfg = dataclasses.replace(
      cfg, model=cfg.judge_model, init_from="", tokenizer=""
    )
  # Frozen, so kept in the compute dtype, as the loop keeps the reference
  # (half the bytes of float32 weights in bf16 runs; the same verdicts).
  model_cfg, params = loaders.load_model(jcfg, mesh)
  params = transformer.compute_params(params, model_cfg)
  tok = loaders.load_tokenizer(jcfg)

  def fn(rollout, examples, ctx):
    questions = [examples[i].question for i in rollout.prompt_ids]
    r, _ = judge_lib.judge(
      params,
      questions,
      rollout.texts,
      jax.random.fold_in(jax.random.key(cfg.seed), ctx.step),
      model_cfg=model_cfg,
      tokenizer=tok,
      samples=cfg.judge_samples,
      temperature=cfg.judge_temperature,
      **ctx.sampler_kwargs(),  # on the run's mesh, as the policy samples
    )
    return np.asarray(r, np.float32)

  return fn


def make_batch(rollout, examples, ctx, *, reward_model):
  """(2) the mixed reward, GRPO advantages; (3) proxy and gold metrics."""
  cfg = ctx.cfg
  gold = objective.correctness(rollout, examples, ctx)
  proxy = reward_model(rollout, examples, ctx)
  w = cfg.rm_weight
  total = w * proxy + (1 - w) * gold
  batch, metrics = objective.outcome_batch(
    rollout,
    examples,
    ctx,
    rewards=(total, {"rm": proxy, "verifier": gold}),
  )
  c, r = bt.preference_pairs(
    gold, cfg.group_size, max_pairs=cfg.group_size**2, seed=ctx.step
  )
  if len(c):
    wins = (proxy[c] > proxy[r]) + 0.5 * (proxy[c] == proxy[r])
    metrics["rm/pair_accuracy"] = float(wins.mean())
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  cfg.validate()
  # Before the warm start and the reward model.
  checked = preflight.check_run(cfg, "rm_grpo")
  cfg = sft.warm_started(cfg)
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  if cfg.rm_kind == "judge":
    reward_model, info = judge_reward(cfg, mesh), {"kind": "judge"}
  else:
    model_cfg, params = loaders.load_model(cfg, mesh)
    ctx = context_lib.Context(
      cfg,
      model_cfg,
      checked.tokenizer,
      mesh,
      checked.reward_fn,
      checked.correct_fn,
    )
    rm_params, info = rm_stage.cached_reward_model(cfg, ctx, params)
    del params
    rm_params = rm.frozen_on_mesh(rm_params, model_cfg, mesh, cfg.dtype)
    reward_model = scalar_reward(rm_params, info, model_cfg)
  workdir = epath.Path(checked.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  storage.write_json(workdir / "reward_model.json", info)
  out = loop.train_and_report(
    cfg,
    name="rm_grpo",
    title="GRPO on a learned reward model (InstructGPT RM, Gao et al. 2022)",
    make_batch=functools.partial(make_batch, reward_model=reward_model),
    loss_fn=objective.loss_fn,
  )
  out.update(
    {f"rm/{k}": v for k, v in info.items() if isinstance(v, (int, float))}
  )
  return out


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
