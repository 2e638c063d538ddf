"""The records that flow through one RL step.

Shape legend (used in every docstring of the library):

  B      prompts
  G      completions per prompt
  N      sequences, N = B * G
  P      prompt length (left padded)
  T      completion length
  S      cache / total length
  V      vocab
  D      model dim
  H / K  query / kv heads
  L      layers

Token conventions: prompts are left padded; padding has position -1 and is
never attended. `mask` is 1 for completion tokens up to and including the
stop token (EOS or an extra stop id) and 0 after it; prompt tokens are not
part of any [N, T] field.
"""

from typing import Any, NamedTuple

import jax
import numpy as np


class Rollout(NamedTuple):
  """G sampled completions for each of B prompts (rollout.generate).

  Device arrays keep the rollout batch sharding; host fields are numpy / str
  for rewards and logging.

  Attributes:
    tokens: [N, P + T] int32 (device), prompt then completion; pad after the
      stop token.
    positions: [N, P + T] int32 (device), 0.. from the first real prompt
      token; -1 on prompt padding and after the stop token.
    prompt_len: P, the (bucketed) prompt length; completion t is at column
      P + t.
    logp: [N, T] fp32 (device), log-prob of each completion token under the
      distribution it was sampled from (temperature and top-k / top-p /
      min-p applied; 0 for greedy); 0 where mask is 0.
    policy_logp: [N, T] fp32 (device), log-prob under the untempered policy
      log softmax(logits); 0 where mask is 0.
    mask: [N, T] int32 (device), 1 up to and including the stop token.
    lengths: [N] int32 (host), completion lengths, mask.sum(-1).
    finish_reasons: [N] str (host), "eos" (an EOS or stop id was emitted) or
      "length" (T tokens without one).
    texts: N completion strings (host), decoded up to and including the
      stop token (the tokenizer drops special tokens such as EOS).
    prompt_ids: [N] int (host), index of the source prompt in the batch;
      the G completions of a prompt are contiguous.
  """

  tokens: jax.Array
  positions: jax.Array
  prompt_len: int
  logp: jax.Array
  policy_logp: jax.Array
  mask: jax.Array
  lengths: np.ndarray
  finish_reasons: np.ndarray
  texts: list[str]
  prompt_ids: np.ndarray


class ExtraParams(NamedTuple):
  """Parameters trained beside the policy's, under their own top-level keys
  of the params dict (e.g. a critic, value.extra_params)."""

  params: dict  # {key: pytree}
  axes: dict  # {key: logical axes with that pytree's structure}
  lr_scales: dict  # {key: lr factor}, see make_optimizer
  # Updates of their own per epoch (0: trained in the policy's step), each
  # on `loss_fn(params, batch, norm, *, cfg, model_cfg)` of their params
  # alone, with optimizers of their own (make_optimizer's group_steps)
  minibatches: int = 0
  loss_fn: Any = None
