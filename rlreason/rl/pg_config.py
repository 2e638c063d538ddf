"""The knobs of the GRPO-family objective (rl/objective.py composes them).

`PGConfig` holds what the shared make_batch and loss read: the advantage
estimator, the policy loss and its clip range, the KL terms, the entropy
bonus, the aggregation and the rollout correction, with their checks.
An experiment's Config subclasses it (experiments/grpo.py's TinyConfig).
"""

import dataclasses
from typing import ClassVar

from rlreason import config
from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses

# Outcome estimators with the signature (rewards [N], group_size, **kw).
OUTCOME_ESTIMATORS = (
  "grpo",
  "dr_grpo",
  "lite_ppo",
  "rloo",
  "gpg",
  "max_minus_second",
)
# Token estimators of outcome rewards, (rewards [N], mask [N, T], ...) -> [N, T]
# (REINFORCE++); they take the per-token KL penalty of kl_reward_coef as
# token rewards.
TOKEN_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
# Estimators that need no group (G = 1 allowed).
_GROUP_FREE = ("lite_ppo", "reinforce_plus_plus")


@dataclasses.dataclass(frozen=True)
class PGConfig(config.BaseConfig):
  """The knobs of the GRPO-family objective (GRPO's values by default)."""

  # The estimators `make_batch` accepts; a subclass may narrow or widen it.
  estimators: ClassVar[tuple[str, ...]] = OUTCOME_ESTIMATORS + TOKEN_ESTIMATORS
  # Whether the experiment's make_batch applies --rollout_correction
  # (outcome_batch does); one that builds its own batch without it sets
  # False, and the flag is then an error instead of a silent no-op.
  corrects_rollouts: ClassVar[bool] = True

  # The advantage estimator (rl/advantages.py): grpo, dr_grpo, lite_ppo,
  # rloo, gpg, max_minus_second, reinforce_plus_plus(_baseline); an
  # experiment may take others (its `estimators`).
  advantage: str = "grpo"
  std_eps: float = 1e-6  # added to the group std (verl's value)
  # The policy-gradient loss (rl/losses.py): ppo, gspo, cispo, gpg,
  # reinforce, clip_cov, kl_cov.
  policy_loss: str = "ppo"
  clip_eps_low: float = 0.2  # the ratio's clip range: down to 1 - this
  # The ratio's clip range: up to 1 + this (above --clip_eps_low: DAPO's
  # clip-higher).
  clip_eps_high: float = 0.2
  # Dual clip of "ppo" (verl's clip_ratio_c, its recipes' 10): a negative
  # advantage's loss is at most -A * this (> 1); 0 = off.
  dual_clip: float = 0.0
  kl_coef: float = 0.0  # beta of the KL-to-reference loss term; 0 = off
  kl_estimator: str = "k3"  # that term's estimator: k1 k2 k3 k3+ abs (kl.py)
  # beta of a per-token KL penalty in the REWARD (InstructGPT, RLOO,
  # REINFORCE++): r_t -= beta * KL_t(old || ref); 0 = off.
  kl_reward_coef: float = 0.0
  kl_reward_estimator: str = "k1"  # that penalty's estimator (kl.py)
  entropy_coef: float = 0.0  # entropy bonus coefficient; 0 = off
  # How token losses make the loss (rl/aggregation.py): token-mean,
  # token-sum, seq-mean-token-mean, seq-mean-token-sum,
  # seq-mean-token-sum-norm.
  aggregation: str = "seq-mean-token-mean"
  # Rollout / trainer mismatch correction (Yao et al. 2025, "Your Efficient
  # RL Framework Secretly Brings You Off-Policy RL Training"): old_logp is
  # recomputed by the trainer and the loss weighted by r = pi_old /
  # pi_sampler, "tis" truncated at C or "mis" masked outside [1/C, C], per
  # token or per sequence; "" = off (old_logp = the sampler's).
  rollout_correction: str = ""
  rollout_correction_level: str = "token"  # its ratio per token | sequence
  rollout_correction_cap: float = 2.0  # C, its truncation / mask bound

  def validate(self) -> None:
    super().validate()
    if self.advantage not in self.estimators:
      raise ValueError(
        f"Invalid config: --advantage={self.advantage!r}; the shared "
        f"objective takes one of {self.estimators} (estimators with "
        "other inputs, e.g. gae, need their own make_batch)"
      )
    for name, get in (
      ("policy_loss", losses.get_policy_loss),
      ("kl_estimator", kl.get),
      ("kl_reward_estimator", kl.get),
    ):
      try:
        get(getattr(self, name))
      except (KeyError, ValueError) as e:
        raise ValueError(f"Invalid config: --{name}: {e}") from None
    if self.aggregation not in aggregation.AGGREGATION_MODES:
      raise ValueError(
        f"Invalid config: --aggregation={self.aggregation!r}; valid: "
        f"{aggregation.AGGREGATION_MODES}"
      )
    self.validate_rollout_correction()
    if self.dual_clip and (self.dual_clip <= 1 or self.policy_loss != "ppo"):
      raise ValueError(
        f"Invalid config: --dual_clip={self.dual_clip} must be > 1 (or 0: "
        f"off) and clips --policy_loss=ppo, not {self.policy_loss}"
      )
    if self.group_size < 2 and self.advantage not in _GROUP_FREE:
      raise ValueError(
        f"Invalid config: --advantage={self.advantage} compares the "
        f"completions of a group, so --group_size must be >= 2 (got "
        f"{self.group_size})"
      )

  @property
  def needs_ref(self) -> bool:
    """Whether the loop must keep a frozen reference model."""
    return bool(self.kl_coef or self.kl_reward_coef)

  def validate_rollout_correction(self) -> None:
    """--rollout_correction*'s checks (ppo validates without the rest)."""
    if self.rollout_correction not in ("", "tis", "mis"):
      raise ValueError(
        f"Invalid config: --rollout_correction={self.rollout_correction!r};"
        " valid: '' (off), tis, mis"
      )
    if self.rollout_correction and not self.corrects_rollouts:
      raise ValueError(
        f"Invalid config: --rollout_correction={self.rollout_correction}: "
        f"{type(self).__module__}'s make_batch builds its own batch and does "
        "not apply it (experiments on objective.outcome_batch and ppo do)"
      )
    if self.rollout_correction_level not in ("token", "sequence"):
      raise ValueError(
        "Invalid config: --rollout_correction_level="
        f"{self.rollout_correction_level!r}; valid: token, sequence"
      )
    if not self.rollout_correction_cap > 1:
      raise ValueError(
        "Invalid config: --rollout_correction_cap="
        f"{self.rollout_correction_cap} must be > 1"
      )
