"""Model-based rewards: a scalar-head reward model (the generative judge:
rewards/judge.py; its Bradley-Terry training: rewards/bradley_terry.py).

It runs beside the verifiable rewards (rewards.combine, or added in an
experiment's make_batch): host-side calls of jitted model code.

Reward model (InstructGPT, arXiv:2203.02155; the RLHF reward models of
verl / OpenRLHF): a decoder preset whose final hidden state at the last
real token goes through a linear head to one scalar,

  r(x, y) = w . h_last(x, y) + b

(`score`, `scores` in batches, `score_rollout`, `score_texts`).
Params are {"backbone": <transformer params>, "head": {"w": [D], "b": []}}
(`save_params` / `load_params`: one safetensors file).
"""

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason.sampling import padding
from rlreason.model import transformer


def init(model_cfg, rng: jax.Array, backbone: Any | None = None) -> dict:
  """Reward-model params: a backbone (random or given) and a zero head."""
  if backbone is None:
    backbone = transformer.init(model_cfg, rng)
  head = {
    "w": jnp.zeros((model_cfg.d_model,), jnp.float32),
    "b": jnp.zeros((), jnp.float32),
  }
  return {"backbone": backbone, "head": head}


def score(params: dict, tokens, positions, model_cfg) -> jax.Array:
  """[N, S] tokens (prompt + response, any padding) -> [N] rewards.

  The hidden state is read at the real token with the largest position
  (the end of the response), wherever the padding is. Activations are
  laid out on the active mesh (mesh.activation_mesh), as the policy's.
  """
  return _score(
    params, tokens, positions, model_cfg, act_mesh=mesh_lib.active_mesh()
  )


@devices.options_jit(static_argnames=("model_cfg", "act_mesh"))
def _score(params, tokens, positions, model_cfg, act_mesh):
  with mesh_lib.activation_mesh(act_mesh):
    hidden, _ = transformer.hidden_states(
      params["backbone"], tokens, positions, model_cfg
    )
  last = jnp.argmax(positions, axis=-1)  # [N]
  h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
  h = h.astype(jnp.float32)
  return h @ params["head"]["w"] + params["head"]["b"]


def save_params(path: str, params: dict) -> None:
  """Nested dicts of arrays -> one safetensors file ('/'-joined keys)."""
  flat = {}

  def walk(prefix, tree):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(f"{prefix}{k}/", v)
      else:
        flat[f"{prefix}{k}"] = np.ascontiguousarray(jax.device_get(v))

  walk("", params)
  safetensors.numpy.save_file(flat, path)


def load_params(path: str) -> dict:
  """The nested dict `save_params` wrote (numpy arrays)."""
  out = {}
  for key, v in safetensors.numpy.load_file(path).items():
    *parents, leaf = key.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def scores(
  params: dict, tokens, positions, model_cfg, *, rows: int = 0, mesh=None
) -> np.ndarray:
  """[N] rewards of [N, S] sequences on the host, `rows` rows per forward
  (0: all at once) with the activations split by batch on `mesh`, as the
  loop's whole-rollout forwards run (Context.completion_scores; the
  planner's reward_model program)."""
  with mesh_lib.activation_mesh(mesh):
    return mesh_lib.to_host(
      policy.by_rows(
        lambda t, p: score(params, t, p, model_cfg), rows, tokens, positions
      )
    )


def score_rollout(
  params: dict, rollout, model_cfg, *, rows: int = 0, mesh=None
) -> np.ndarray:
  """[N] rewards of a rollout's sequences (the policy's tokenizer), as
  `scores`."""
  return scores(
    params, rollout.tokens, rollout.positions, model_cfg, rows=rows, mesh=mesh
  )


def frozen_on_mesh(params: dict, model_cfg, mesh, dtype) -> dict:
  """A trained reward model as the RL loop scores with it: the backbone in
  `dtype` (the compute dtype, which the model casts every weight to
  before use: half the bytes in bf16 runs, as the loop keeps the
  reference) laid out as the train state (TRAIN_RULES), the head
  replicated in float32. The params may be on devices (just trained) or
  on the host (load_params: a cached model)."""

  def put(x, sharding, dt):
    if isinstance(x, jax.Array):
      return jax.device_put(x.astype(dt), sharding)
    return mesh_lib.put_global(np.asarray(x, dt), sharding)

  backbone = params["backbone"]
  shardings = mesh_lib.shardings(
    mesh, transformer.param_axes(model_cfg), mesh_lib.TRAIN_RULES, backbone
  )
  return {
    "backbone": jax.tree.map(
      lambda x, s: put(x, s, jnp.dtype(dtype)), backbone, shardings
    ),
    "head": jax.tree.map(
      lambda x: put(x, mesh_lib.replicated(mesh), jnp.float32),
      params["head"],
    ),
  }


def score_texts(
  params: dict,
  prompts: Sequence[str],
  completions: Sequence[str],
  *,
  model_cfg,
  tokenizer,
  bucket: int = 32,
) -> np.ndarray:
  """[N] rewards of prompt + completion texts (the RM's own tokenizer)."""
  ids = [
    tokenizer.encode(p + c) or [tokenizer.pad_id]
    for p, c in zip(prompts, completions, strict=True)
  ]
  tokens, positions = padding.pad_prompts(ids, tokenizer.pad_id, bucket=bucket)
  return np.asarray(score(params, tokens, positions, model_cfg))


def reward_model_fn(params: dict, *, model_cfg, tokenizer):
  """The reward model as a registry-style reward, for rewards.combine:
  fn(completions, answers=None, *, questions) -> [N]."""

  def fn(completions, answers=None, *, questions):
    del answers  # the reward model reads question + response only
    return score_texts(
      params, questions, completions, model_cfg=model_cfg, tokenizer=tokenizer
    )

  return fn
