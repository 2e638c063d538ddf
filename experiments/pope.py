r"""POPE: privileged on-policy exploration with oracle solution prefixes.

Paper: "POPE: Learning to Reason on Hard Problems via Privileged On-Policy
Exploration" (Qu et al. 2026, arXiv:2601.18779; see also
/work/shared/seeds/001_*). Differs from experiments/grpo.py in exactly:
  (1) hard problems only: the data are the harder arithmetic levels, and a
      prompt the policy has always solved is not sampled again
      (difficulty.skip_solved on the per-prompt tracker), since mixing easy
      and hard problems hurts ("ray interference");
  (2) privileged guidance: a prompt whose G rollouts all fail is sampled
      again with a prefix of its oracle solution (hints.solution_prefix,
      --prefix_fraction of the solution's lines) as the start of the
      response, and those guided rollouts replace the group (rlreason/
      guided.py);
  (3) guided rollouts are trained on-policy in the guided context (the
      prefix is prompt, not trained), unlike off-policy methods that train
      on the oracle solution itself; evaluation is unguided.
  Deviations: the paper phrases the prefix with an instruction to continue
  it; the char model here continues a response prefix directly. Summaries
  of the paper (not the paper itself, not in our sources) say it tries
  progressively longer prefixes, up to a quarter of the solution, until
  one is solved (here: one fixed --prefix_fraction), and trains on the
  guided and the unguided versions together (here the guided group
  replaces the all-wrong one, whose GRPO advantages are all 0: only the
  normalisers and a KL term differ).

Reproduces:
  laptop: the paper's central claim, guidance on hard problems transfers
    to unguided ones: held-out (unguided) accuracy of POPE vs the same
    recipe without guidance (--prefix_fraction=0):
      python -m experiments.reproduce --method=pope --seeds=0,1,2
    Expected: pope's eval accuracy and `accuracy` (unguided round-0
    rollouts) end above no_guidance's.
  paper: the paper's hard-problem pass@k tables (numbers not quoted in our
    sources).

CPU:  python -m experiments.pope
TPU:  launch/tpu.sh run experiments.pope --scale=paper \
        --model=/ckpt/Qwen2.5-7B-Instruct --data=/data/hard_math.jsonl \
        --workdir=gs://$BUCKET/pope/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

from experiments import claims
from experiments import grpo
from rlreason import config
from rlreason.data import difficulty
from rlreason.train import flags as rr_flags
from rlreason.guidance import resampling as guided
from rlreason.guidance import hints
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale on hard problems; paper: PAPER."""

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=2-3,n=4000"  # (1)
  max_prompt_len: int = 64  # room for the prefix
  max_new_tokens: int = 56  # level 3's solutions: up to 53 tokens
  prefix_fraction: float = 0.5  # (2) assumed: the paper's length not public
  solved_threshold: float = 1.0  # (1) EMA accuracy that counts as solved
  tracker_decay: float = 0.5  # (1) the per-prompt EMA accuracy's decay

  def validate(self) -> None:
    super().validate()
    for name in ("prefix_fraction", "solved_threshold", "tracker_decay"):
      value = getattr(self, name)
      config.require(0 <= value <= 1, f"--{name}={value} not in [0, 1]")


# The shipped-base testbed (reproduce.py --testbed=base): the hard
# level-3 problems (claims.BASE_LEVEL3), where all-wrong groups stay common.
BASE = claims.BASE_LEVEL3


# The paper's model, data and budgets are not in our sources: assumed.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B-Instruct",  # assumed
  data="/data/hard_math.jsonl",  # assumed: problems with pass@k = 0
  group_size=16,  # assumed
  max_new_tokens=8192,  # assumed
  max_prompt_len=4096,  # room for the oracle prefix
)


def hint_fn(cfg):
  def fn(example, ctx):
    prefix = hints.solution_prefix(example.solution, cfg.prefix_fraction)
    return hints.with_hint(example, prefix=prefix) if prefix else None

  return fn


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  tracker = difficulty.Tracker(decay=cfg.tracker_decay)
  make_batch = guided.make_batch([hint_fn(cfg)])  # (2), (3)
  return loop.train_and_report(
    cfg,
    name="pope",
    title="POPE (privileged on-policy exploration)",
    make_batch=difficulty.tracking(make_batch, tracker),
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.prompts(  # (1)
      tracker, difficulty.skip_solved(cfg.solved_threshold)
    ),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
