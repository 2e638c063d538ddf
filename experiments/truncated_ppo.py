r"""T-PPO: PPO updates on truncated responses, with Extended GAE.

Paper: Fan et al. 2025 (ByteDance Seed), "Truncated Proximal Policy
Optimization",
arXiv:2506.15050. Built on experiments/ppo.py (critic + GAE). Differs from
it in exactly:
  (1) successive batched generation: the batch is a fixed set of N slots.
      Each step generates one window of --max_new_tokens tokens for every
      slot; a slot whose response is still unfinished continues it in the
      next step (its earlier windows become context), and a slot whose
      response ended (stop token, or --max_response_len tokens in all) is
      refilled with a new prompt. Policy updates no longer wait for the
      longest response of a batch;
  (2) Extended GAE (value.extended_gae): a response cut at the window is
      not terminal; its advantages bootstrap from the critic's value at
      the cut, V(s_L), instead of 0; it gets its outcome reward only in the
      step it ends;
  (3) policy and critic learn from different tokens: the policy from every
      slot's current window (the earlier windows were trained on when they
      were generated), the critic only from responses that ended this step,
      on all their tokens with Monte-Carlo returns (the truncated ones have
      no return yet).
Laptop deviations: the shared loop samples a fresh batch every step and
this file refills empty slots from it, discarding the rows of slots still
in flight, so it reproduces T-PPO's updates, not its wall-clock savings;
in-flight slots live on the host, checkpointed with the data's position
(Slots.state): a resumed run continues them.

Reproduces (paper scale): AIME 2024 with a 32B base model, up to 2.5x the
training efficiency of PPO at equal or better accuracy (abstract; the
window and length settings are not restated here). Expected at laptop
scale: held-out accuracy rising as with experiments/ppo.py, with
tppo/in_flight > 0 (responses spanning windows) and the critic's
explained variance rising. tppo/outcome_tokens is the share of a step's
window tokens credited with an outcome; the rest learn only through the
critic (on the shipped base they do not: experiments/README.md).

CPU:  python -m experiments.truncated_ppo
TPU:  launch/tpu.sh run experiments.truncated_ppo --scale=paper \
        --model=/ckpt/Qwen2.5-32B \
        --workdir=gs://$BUCKET/truncated_ppo/$(date +%m%d_%H%M)
"""

import base64
import dataclasses
from typing import ClassVar
import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments import ppo
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason import mesh as mesh_lib
from rlreason.rl import returns as returns_lib
from rlreason.sampling import rollout as rollout_lib
from rlreason.sampling import draw as sampling_lib
from rlreason.data import difficulty
from rlreason.data.sources import Example
from rlreason.rl import value


@dataclasses.dataclass(frozen=True)
class Config(ppo.Config):
  """ppo.py's laptop setup with windowed generation."""

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  max_new_tokens: int = 10  # (1) the generation window
  # (1) a response's budget (grpo.py's 40: 4 windows), rounded up to whole
  # windows; also the warm start's completion length.
  max_response_len: int = 40
  # Evaluation decodes whole responses, not one window.
  eval_max_new_tokens: int = 40  # = max_response_len
  # Not T-PPO: the first K steps train the critic only (zero policy
  # advantages), as VC-PPO / VAPO's value pretraining; a diagnostic for the
  # bootstrap at the cut, which is only as good as the critic.
  critic_warmup: int = 0

  def validate(self) -> None:
    super().validate()
    if self.max_response_len < self.max_new_tokens:
      raise ValueError(
        f"Invalid config: --max_response_len={self.max_response_len} is "
        f"shorter than one window (--max_new_tokens={self.max_new_tokens})"
      )
    if self.critic_warmup < 0 or 0 < self.steps <= self.critic_warmup:
      raise ValueError(
        f"Invalid config: --critic_warmup={self.critic_warmup} must be >= 0 "
        f"and below --steps={self.steps}"
      )
    if self.top_p < 1 or self.top_k:
      raise ValueError("Invalid config: T-PPO here samples without filters")
    if self.eval_max_new_tokens < self.max_response_len:
      raise ValueError(
        f"Invalid config: --eval_max_new_tokens={self.eval_max_new_tokens} "
        f"is shorter than a response (--max_response_len="
        f"{self.max_response_len}): evaluation would cut answers"
      )


# The shipped-base testbed (reproduce.py --testbed=base): four windows of 32
# tokens make the main job's 128-token response.
BASE = dict(max_new_tokens=32, max_response_len=128, eval_max_new_tokens=128)

# The paper trains a 32B base model on math with long CoT and evaluates on
# AIME 2024; its window, budget, batch and learning rates are not restated
# here: the values below are assumptions in ppo.py's PAPER style (an 8k
# window of a 24k budget). Four micro-batches of 128 rows, which split up
# to v5p-256's 128 chips (ppo.py's 128 micro-batches gave 4 rows, which
# the 16 chips of v5p-32, the smallest slice holding the policy's and the
# critic's train state, do not split). It fits v5p-256, one row of 34k
# tokens per chip: 70.1 GiB per chip, the train step's (the planner's
# table in README.md).
PAPER = dict(
  ppo.PAPER,
  minibatches=4,  # joint updates, not ppo.PAPER's ORZ schedule (assumed)
  critic_minibatches=0,
  micro_batches=4,
  model="/ckpt/Qwen2.5-32B",  # no preset; a local HF checkpoint
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  eval_size=30,
  eval_samples=16,
  group_size=16,
  max_new_tokens=8192,
  max_response_len=24576,
  eval_max_new_tokens=24576,
)


@dataclasses.dataclass
class Slots:
  """Host state of the in-flight responses, one entry per batch row."""

  n: int
  calls: int = 0  # continuation calls (their sampling key)

  def __post_init__(self):
    self.example = [None] * self.n  # the slot's Example; None = free
    self.context = [[] for _ in range(self.n)]  # its prompt's token ids
    self.done = [[] for _ in range(self.n)]  # its earlier windows' ids

  def state(self) -> dict:
    """The slots as JSON data, checkpointed with the data's position
    (difficulty.tracked_iterator). Token ids are base64 int32 text: up to
    24k ids a slot at paper scale, and the loop copies the state every
    step (strings copy for free)."""
    return {
      "calls": self.calls,
      "example": [
        dataclasses.asdict(e) if e is not None else None for e in self.example
      ],
      "context": [_ids_text(c) for c in self.context],
      "done": [_ids_text(d) for d in self.done],
    }

  def restore(self, state: dict) -> None:
    if len(state["example"]) != self.n:
      raise ValueError(
        f"the checkpoint holds {len(state['example'])} T-PPO slots, the "
        f"run {self.n} (--batch_size x --group_size)"
      )
    self.calls = int(state["calls"])
    self.example = [
      None
      if e is None
      else Example(**{**e, "knowledge": tuple(e["knowledge"])})
      for e in state["example"]
    ]
    self.context = [_ids(c) for c in state["context"]]
    self.done = [_ids(d) for d in state["done"]]


def _ids_text(ids) -> str:
  return base64.b64encode(np.asarray(ids, np.int32).tobytes()).decode()


def _ids(text: str) -> list[int]:
  return np.frombuffer(base64.b64decode(text), np.int32).tolist()


def _left_pad(r, p: int, pad_id: int):
  """Host tokens, positions of rollout `r` with its prompt padded to p."""
  tokens, positions = mesh_lib.to_host((r.tokens, r.positions))
  extra = p - r.prompt_len
  n = tokens.shape[0]
  tokens = np.concatenate([np.full((n, extra), pad_id, np.int32), tokens], 1)
  positions = np.concatenate([np.full((n, extra), -1, np.int32), positions], 1)
  return tokens, positions


def _window_batch(rollout, examples, ctx, slots: Slots):
  """(1): one window per slot; rows in slot order, prompts padded alike.

  Returns (batch with tokens / positions / mask / old_logp, per-slot
  completion ids of this window, finish reasons).
  """
  cfg = ctx.cfg
  busy = [i for i in range(slots.n) if slots.example[i] is not None]
  free = [i for i in range(slots.n) if slots.example[i] is None]
  prompts = ctx.encode_prompts(examples)
  for row, i in zip(range(len(free)), free):  # fresh rows refill free slots
    slots.example[i] = examples[rollout.prompt_ids[row]]
    slots.context[i] = prompts[rollout.prompt_ids[row]]
    slots.done[i] = []
  parts = [(rollout, list(range(len(free))), free)]
  if busy:
    slots.calls += 1
    # As the run's sampler samples (--rollout_dtype, --rollout_layout,
    # --rollout_tensor, --rollout_rows, its budget), in static calls: the
    # program plan_config plans.
    cont = rollout_lib.generate(
      ctx.params,
      [slots.context[i] + slots.done[i] for i in busy],
      jax.random.key(cfg.seed + 7919),
      slots.calls,
      model_cfg=ctx.rollout_model_cfg,
      tokenizer=ctx.tokenizer,
      max_new_tokens=cfg.max_new_tokens,
      sampling=sampling_lib.Sampling(temperature=cfg.temperature),
      max_prompt_len=cfg.max_prompt_len + cfg.max_response_len,
      **{**ctx.sampler_kwargs(), "batching": "static"},
    )
    parts.append((cont, list(range(len(busy))), busy))
  p = max(r.prompt_len for r, _, _ in parts)
  t = cfg.max_new_tokens
  tokens = np.zeros((slots.n, p + t), np.int32)
  positions = np.zeros((slots.n, p + t), np.int32)
  mask = np.zeros((slots.n, t), np.float32)
  logp = np.zeros((slots.n, t), np.float32)
  reasons = np.empty(slots.n, object)
  for r, rows, dest in parts:
    tok, pos = _left_pad(r, p, ctx.tokenizer.pad_id)
    m, lp = mesh_lib.to_host((r.mask, r.logp))
    tokens[dest], positions[dest] = tok[rows], pos[rows]
    mask[dest], logp[dest] = m[rows], lp[rows]
    reasons[dest] = np.asarray(r.finish_reasons)[rows]
  window = [tokens[i, p:][mask[i] > 0].tolist() for i in range(slots.n)]
  batch = {
    "tokens": tokens,
    "positions": positions,
    "mask": mask,
    "sampler_logp": logp,
    "old_logp": logp,
  }
  return batch, window, reasons


def make_batch(rollout, examples, ctx, *, slots: Slots):
  cfg = ctx.cfg
  batch, window, reasons = _window_batch(rollout, examples, ctx, slots)
  n, p = slots.n, batch["tokens"].shape[1] - cfg.max_new_tokens
  mask = batch["mask"]
  total_len = np.array([len(slots.done[i]) + len(window[i]) for i in range(n)])
  ended = (reasons == "eos") | (total_len >= cfg.max_response_len)
  texts = [ctx.tokenizer.decode(slots.done[i] + window[i]) for i in range(n)]
  answers = [slots.example[i].answer for i in range(n)]
  reward, parts = ctx.reward_fn(texts, answers)
  reward = np.where(ended, np.asarray(reward, np.float32), 0.0)

  # (2) EGAE on this window, from the critic at rollout time.
  with ctx.scoring():  # split by batch, budgeted: as ctx.ref_logp
    values = mesh_lib.to_host(
      value.completion_values_by_rows(
        ctx.extra[value.KEY],
        jnp.asarray(batch["tokens"]),
        jnp.asarray(batch["positions"]),
        ctx.model_cfg,
        1,
        rows=ctx.score_rows,
        with_next=True,
      )
    )  # [N, S]: column c = V of the state after token c
  win_values = values[:, p - 1 :]  # [N, T + 1]
  token_rewards = returns_lib.outcome_token_rewards(
    jnp.asarray(reward), jnp.asarray(mask)
  )
  adv, _ = value.extended_gae(
    token_rewards,
    jnp.asarray(win_values),
    jnp.asarray(mask),
    jnp.asarray(~ended),
    gamma=cfg.gamma,
    lam=cfg.lam,
    whiten_advantages=cfg.whiten_advantages,
  )
  batch["adv"] = np.asarray(adv, np.float32)
  if ctx.step < cfg.critic_warmup:  # the policy waits for its critic
    batch["adv"] = np.zeros_like(batch["adv"])

  # (3) The critic: every token of the responses that ended, MC returns.
  s = batch["tokens"].shape[1]
  vmask = np.zeros((n, s - 1), np.float32)  # column c predicts token c + 1
  for i in np.flatnonzero(ended):
    start = p - len(slots.done[i]) - 1
    vmask[i, start : p - 1 + len(window[i])] = 1.0
  tok_r = returns_lib.outcome_token_rewards(
    jnp.asarray(reward), jnp.asarray(vmask)
  )
  mc_adv, _ = returns_lib.gae(
    tok_r,
    jnp.zeros_like(tok_r),
    jnp.asarray(vmask),
    gamma=cfg.gamma,
    lam=1.0,
    whiten_advantages=False,
  )  # with V = 0, A is the discounted return
  batch["value_mask"] = vmask
  batch["value_returns"] = np.asarray(mc_adv, np.float32)
  batch["value_old"] = np.where(vmask > 0, values[:, :-1], 0.0).astype(
    np.float32
  )

  correct = np.asarray(ctx.correct_fn(texts, answers), np.float32)
  metrics = {
    "reward": float(reward[ended].mean()) if ended.any() else 0.0,
    "accuracy": float(correct[ended].mean()) if ended.any() else 0.0,
    "tppo/ended": float(ended.mean()),
    "tppo/in_flight": float((~ended).mean()),
    "tppo/ended_length": float(total_len[ended].mean()) if ended.any() else 0,
    # The window's tokens whose advantage holds the outcome (the ended
    # responses'); the rest learn only through the critic, V(cut) - V(s_t).
    "tppo/outcome_tokens": float(mask[ended].sum() / max(mask.sum(), 1.0)),
  }
  metrics["value/explained_var"] = ppo.explained_variance(
    batch["value_returns"], batch["value_old"], vmask
  )
  metrics.update({f"reward/{k}": np.mean(v) for k, v in parts.items()})
  for i in range(n):  # advance the slots
    if ended[i]:
      slots.example[i] = None
    else:
      slots.done[i] = slots.done[i] + window[i]
  return batch, metrics


def critic(cfg: Config):
  """ppo's critic on this critic's loss (also the planner's hook,
  experiments/plan.py)."""
  return ppo.critic(cfg, critic_loss)


def plan_config(cfg: Config) -> Config:
  """The shapes a window's programs run at: a response's earlier windows
  are prompt context (`_window_batch`), up to the continuation call's
  prompt budget of max_prompt_len + max_response_len tokens. The rollout
  planned is that call's, a static one (rollout.generate's default;
  the fresh rows' continuous one has the short prompts)."""
  prompt = cfg.max_prompt_len + cfg.max_response_len
  return dataclasses.replace(
    cfg, max_prompt_len=prompt, rollout_batching="static"
  )


def train_fields(cfg: Config) -> dict:
  """Per-row shapes of the critic's batch fields (column c predicts token
  c + 1 of the whole sequence)."""
  s = cfg.max_prompt_len + cfg.max_new_tokens - 1
  return {"value_mask": (s,), "value_returns": (s,), "value_old": (s,)}


def critic_loss(params, batch, norm, *, cfg: Config, model_cfg):
  """(3) The critic's clipped value loss on the ended responses alone."""
  critic_batch = {
    "tokens": batch["tokens"],
    "positions": batch["positions"],
    "mask": batch["value_mask"],
    "old_values": batch["value_old"],
    "returns": batch["value_returns"],
  }
  return value.loss(
    params[value.KEY],
    critic_batch,
    norm,
    model_cfg=model_cfg,
    clip_eps=cfg.value_clip or None,
    mask=batch["value_mask"],
    num_tokens=norm["value_mask_tokens"],  # the whole minibatch's
  )


def loss_fn(params, batch, norm, *, cfg: Config, model_cfg):
  """PPO's clipped surrogate on the window + the critic on ended responses
  (the surrogate alone when the critic takes its own updates)."""
  return ppo.loss_fn(
    params, batch, norm, cfg=cfg, model_cfg=model_cfg, own_critic=critic_loss
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  # The warm start imitates whole responses, not single windows.
  cfg = loop.warm_started(
    cfg, "truncated_ppo", needs_ref=False, max_new_tokens=cfg.max_response_len
  )
  slots = Slots(cfg.num_sequences)
  return loop.train_and_report(
    cfg,
    name="truncated_ppo",
    title="T-PPO (windowed PPO + EGAE)",
    make_batch=functools.partial(make_batch, slots=slots),
    loss_fn=loss_fn,
    needs_ref=False,
    extra_params=critic(cfg),
    prompt_iterator=difficulty.tracked_iterator(slots),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
