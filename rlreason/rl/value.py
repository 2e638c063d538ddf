"""A learned value function (critic) for PPO: a scalar head on a decoder.

PPO for language models (InstructGPT, Ouyang et al. 2022, arXiv:2203.02155;
Open-Reasoner-Zero, Hu et al. 2025, arXiv:2503.24290; verl's and
OpenRLHF's critics) learns V(s_t), the expected return from the state
before completion token t, with a separate model: a decoder trunk (by
default a copy of the policy's, as verl and OpenRLHF initialise the critic
from the actor's checkpoint) and a linear head on its final hidden states.

  params = value.init(model_cfg, rng, policy_params=policy)   # or None
  values = value.completion_values(params, tokens, positions, model_cfg, P)
  adv, returns = returns_lib.gae(token_rewards, values, mask)
  loss, metrics = value.loss(params, batch, norm, model_cfg=model_cfg)

Parameters: {"trunk": decoder params without an LM head, "head": {"kernel":
[D], "bias": []}}. The trunk runs as `trunk_config(model_cfg)` (embeddings
tied, so it has no lm_head); the head starts at zero, so V = 0 and the
first advantages are the discounted returns. In the RL loop the critic
lives beside the policy under params[KEY] (loop.train(..., extra_params=
value.extra_params(lr_scale))): one TrainState, one checkpoint, and its own
clipping and learning rate (optimizer.make_optimizer(lr_scales=...)), or
with `minibatches` updates of its own on its loss alone and an optimizer
of its own (Open-Reasoner-Zero's 12 critic updates to the policy's 1).

`value_loss` is PPO's per-token (clipped) value loss that `loss`
aggregates; `extended_gae` is T-PPO's advantage for truncated responses
(arXiv:2506.15050): GAE bootstrapped from V at the truncation point.

Shapes: N sequences, P prompt length, T completion length, S = P + T,
D model dim. values[:, t] is aligned with policy.completion_logprobs'
logp[:, t]: both are read from the hidden state at position P + t - 1.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp

from rlreason import devices
from rlreason.rl import aggregation
from rlreason.rl import returns as returns_lib
from rlreason import mesh as mesh_lib
from rlreason import types
from rlreason.model import policy
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig

KEY = "critic"  # the critic's top-level key beside the policy's params


def trunk_config(model_cfg: ModelConfig) -> ModelConfig:
  """The trunk's architecture: the policy's, without an LM head."""
  return dataclasses.replace(model_cfg, tie_embeddings=True)


def init(model_cfg: ModelConfig, rng: jax.Array, *, policy_params=None):
  """Critic params: the policy's trunk (copied) or a random one; zero head.

  Args:
    model_cfg: the policy's architecture.
    rng: key for a random trunk (unused with policy_params).
    policy_params: initialise the trunk from these (their LM head, if any,
      is dropped); None = random init.

  Returns:
    {"trunk": ..., "head": {"kernel": [D] zeros, "bias": [] zero}}.
  """
  if policy_params is None:
    trunk = transformer.init(trunk_config(model_cfg), rng)
  else:
    # Copies: the critic is trained apart from the policy, and a donated
    # train state must not alias its buffers.
    trunk = {
      k: jax.tree.map(jnp.copy, v)
      for k, v in policy_params.items()
      if k != "lm_head"
    }
  dtype = jnp.dtype(model_cfg.param_dtype)
  head = {
    "kernel": jnp.zeros((model_cfg.d_model,), dtype),
    "bias": jnp.zeros((), dtype),
  }
  return {"trunk": trunk, "head": head}


def param_axes(model_cfg: ModelConfig):
  """Logical axes with the structure of `init`'s params."""
  return {
    "trunk": transformer.param_axes(trunk_config(model_cfg)),
    "head": {"kernel": ("embed",), "bias": ()},
  }


def completion_values(
  params,
  tokens: jax.Array,
  positions: jax.Array,
  model_cfg: ModelConfig,
  prompt_len: int,
  *,
  with_next: bool = False,
) -> jax.Array:
  """V of the state before each completion token (activations split by
  batch under mesh.activation_mesh, as policy.completion_logprobs).

  Args:
    params: critic params (`init`).
    tokens: [N, S] prompt (left padded, length P) then completion.
    positions: [N, S]; -1 on padding.
    model_cfg: the policy's architecture.
    prompt_len: P (static).
    with_next: also the value after the last slot: [N, T + 1] instead of
      [N, T] (column t = the state after t completion tokens), for
      bootstrapping truncated responses (`extended_gae`).

  Returns:
    values [N, T] (or [N, T + 1]) in float32; garbage where mask = 0.
  """
  return _completion_values(
    params,
    tokens,
    positions,
    model_cfg,
    prompt_len,
    with_next=with_next,
    act_mesh=mesh_lib.active_mesh(),
  )


@devices.options_jit(  # under devices.compile_options: --score_temp_budget_mib
  static_argnames=("model_cfg", "prompt_len", "with_next", "act_mesh"),
)
def _completion_values(
  params, tokens, positions, model_cfg, prompt_len, *, with_next, act_mesh
):
  with mesh_lib.activation_mesh(act_mesh):
    return _values(params, tokens, positions, model_cfg, prompt_len, with_next)


def _values(params, tokens, positions, model_cfg, prompt_len, with_next):
  hidden, _ = transformer.hidden_states(
    params["trunk"], tokens, positions, trunk_config(model_cfg)
  )
  # Position P + t - 1 holds the state before completion token t.
  hidden = hidden[:, prompt_len - 1 : None if with_next else -1]
  head = params["head"]
  values = jnp.einsum(
    "ntd,d->nt",
    hidden.astype(jnp.float32),
    head["kernel"].astype(jnp.float32),
  )
  return values + head["bias"].astype(jnp.float32)


def completion_values_by_rows(
  params, tokens, positions, model_cfg, prompt_len, *, rows: int, **kwargs
):
  """completion_values over `rows` rows per forward (policy.by_rows; 0 =
  all at once): a whole rollout's values with one micro-batch's peak."""
  return policy.by_rows(
    lambda t, p: completion_values(
      params, t, p, model_cfg, prompt_len, **kwargs
    ),
    rows,
    tokens,
    positions,
  )


def value_loss(
  values: jax.Array,
  old_values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  clip_eps: float | None = 0.2,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Squared error of the value head, optionally clipped around old values.

  PPO value clipping (OpenAI baselines ppo2; verl, OpenRLHF):
    v_clip = old_v + clip(v - old_v, -eps, eps)
    l = 0.5 max((v - R)^2, (v_clip - R)^2)
  The PPO paper itself has no clipping (clip_eps=None); baselines uses 0.2,
  verl's default is 0.5.

  Args:
    values: [N, T] current value predictions.
    old_values: [N, T] predictions at rollout time.
    returns: [N, T] targets (returns.gae's returns).
    mask: [N, T] completion-token mask.
    clip_eps: clip range, or None.

  Returns:
    (per-token loss [N, T], metrics "vf_clipfrac" [N, T]).
  """
  chex.assert_equal_shape([values, old_values, returns, mask])
  loss = jnp.square(values - returns)
  clipped = jnp.zeros_like(loss, dtype=bool)
  if clip_eps is not None:
    v_clip = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    loss_clip = jnp.square(v_clip - returns)
    clipped = loss_clip > loss
    loss = jnp.maximum(loss, loss_clip)
  metrics = {"vf_clipfrac": clipped.astype(jnp.float32)}
  return jnp.where(mask > 0, 0.5 * loss, 0.0), metrics


def loss(
  params,
  batch: dict,
  norm: dict,
  *,
  model_cfg: ModelConfig,
  clip_eps: float | None = 0.5,
  mask: jax.Array | None = None,
  num_tokens: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
  """Token-mean clipped value loss of the critic on a batch.

  Batch keys: tokens, positions, mask [N, T], old_values [N, T] (the
  rollout-time predictions) and returns [N, T] (the GAE targets).
  0.5 max((V - R)^2, (V_clip - R)^2) (`value_loss`), averaged over the
  whole minibatch's tokens (norm["num_tokens"], verl's critic default
  token-mean). clip_eps = 0.5 is verl's cliprange_value.

  Args:
    params: critic params.
    batch, norm: as train_step passes them.
    model_cfg: the policy's architecture.
    clip_eps: value clip range, or None.
    mask: [N, T] tokens the critic learns from (default batch["mask"]);
      T-PPO trains it on complete responses only.
    num_tokens: the whole minibatch's count of `mask` tokens (default
      norm["num_tokens"] for the default mask, else the local count).

  Returns:
    (scalar loss, metrics: value_loss, vf_clipfrac, value_mean).
  """
  tokens, m = batch["tokens"], batch["mask"] if mask is None else mask
  values = completion_values(
    params,
    tokens,
    batch["positions"],
    model_cfg,
    tokens.shape[1] - m.shape[1],
  )
  per_token, metrics = value_loss(
    values, batch["old_values"], batch["returns"], m, clip_eps=clip_eps
  )
  if num_tokens is None and mask is None:
    num_tokens = norm["num_tokens"]
  out = aggregation.aggregate(per_token, m, "token-mean", num_tokens=num_tokens)
  return out, {
    "value_loss": out,
    "vf_clipfrac": aggregation.aggregate(metrics["vf_clipfrac"], m),
    "value_mean": aggregation.aggregate(values, m),
  }


def extra_params(
  lr_scale: float = 1.0,
  *,
  from_policy: bool = True,
  minibatches: int = 0,
  loss_fn=None,
):
  """The loop hook that adds a critic beside the policy (loop.train's
  `extra_params`): params[KEY], trained at lr * lr_scale.

  Args:
    lr_scale: critic lr / policy lr (verl: 1e-5 / 1e-6; Open-Reasoner-Zero
      5e-6 / 1e-6).
    from_policy: copy the policy's trunk (True) or start from a random one.
    minibatches: the critic's own updates per epoch, on `loss_fn` (its
      loss alone, e.g. ppo.critic_loss), with an optimizer of its own
      (Open-Reasoner-Zero: 12 to the policy's 1); 0 = in the policy's
      step, on the experiment's loss.
  """

  def make(cfg, model_cfg, policy_params) -> types.ExtraParams:
    params = init(
      model_cfg,
      jax.random.fold_in(jax.random.key(cfg.seed), 1),
      policy_params=policy_params if from_policy else None,
    )
    return types.ExtraParams(
      params={KEY: params},
      axes={KEY: param_axes(model_cfg)},
      lr_scales={KEY: lr_scale},
      minibatches=minibatches,
      loss_fn=loss_fn,
    )

  return make


def extended_gae(
  token_rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  truncated: jax.Array,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
  whiten_advantages: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """GAE that bootstraps truncated responses from the critic (T-PPO EGAE).

  T-PPO (arXiv:2506.15050, "Extended GAE"): a response cut
  at its generation window is not terminal; its last TD error bootstraps
  from the value of the state after its last token,
    delta_{L-1} = r_{L-1} + gamma V(s_L) - V(s_{L-1}),
  while complete responses end with V = 0 as in `returns.gae`. This is
  GAE with gamma V(s_L) added to the last token's reward.

  Args:
    token_rewards: [N, T] per-token rewards (0 outcome reward for truncated
      responses, plus any KL penalty).
    values: [N, T + 1] `completion_values(..., with_next=True)`.
    mask: [N, T] completion mask, contiguous from t = 0 (length L = sum).
    truncated: [N] bool, the responses that did not end (no stop token).
    gamma, lam, whiten_advantages: as returns.gae.

  Returns:
    (advantages [N, T], returns [N, T]), both 0 where mask = 0.
  """
  chex.assert_rank([token_rewards, values, mask, truncated], [2, 2, 2, 1])
  chex.assert_equal_shape([token_rewards, mask])
  length = jnp.asarray(mask > 0, jnp.int32).sum(-1)  # [N]
  v_next = jnp.take_along_axis(values, length[:, None], axis=-1)[:, 0]
  boot = jnp.where(jnp.asarray(truncated) & (length > 0), gamma * v_next, 0.0)
  rewards = token_rewards + returns_lib.outcome_token_rewards(boot, mask)
  return returns_lib.gae(
    rewards,
    values[:, :-1],
    mask,
    gamma=gamma,
    lam=lam,
    whiten_advantages=whiten_advantages,
  )
