"""Model-based rewards: a scalar-head reward model (the generative judge:
rewards/judge.py).

It runs beside the verifiable rewards (rewards.combine, or added in an
experiment's make_batch): host-side calls of jitted model code.

Reward model (InstructGPT, arXiv:2203.02155; the RLHF reward models of
verl / OpenRLHF): a decoder preset whose final hidden state at the last
real token goes through a linear head to one scalar,

  r(x, y) = w . h_last(x, y) + b

trained with the Bradley-Terry loss -log sigmoid(r(chosen) - r(rejected)),
i.e. P(chosen > rejected) = sigmoid(r(chosen) - r(rejected)) (`train_bt`:
minibatch Adam on preference pairs; `pairwise_accuracy` is the held-out
metric InstructGPT reports, ties counted half). `preference_pairs` builds
pairs from sampled groups with a verifier: chosen = a correct sample,
rejected = an incorrect one for the same prompt.
Params are {"backbone": <transformer params>, "head": {"w": [D], "b": []}}
(`save_params` / `load_params`: one safetensors file).
"""

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import safetensors.numpy

from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.model import policy
from rlreason.sampling import padding
from rlreason.model import transformer
from rlreason.rl import aggregation


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


def bradley_terry_loss(params, chosen, rejected, model_cfg) -> jax.Array:
  """Mean -log sigmoid(r(chosen) - r(rejected)); each a (tokens, positions)
  pair of [N, S] arrays (widths may differ: the narrower is left-padded,
  positions -1). Both sides in one forward of 2N rows: the weights are
  read (gathered, on a mesh) once per step, not twice. The head's bias
  gets no gradient: a shift of every reward leaves the loss unchanged, so
  its gradient is rounding noise, which Adam would turn into steps of
  the learning rate's size."""
  head = {**params["head"], "b": jax.lax.stop_gradient(params["head"]["b"])}
  params = {**params, "head": head}
  n = chosen[0].shape[0]
  width = max(chosen[0].shape[1], rejected[0].shape[1])

  def left_pad(x, fill):
    return jnp.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

  tokens = jnp.concatenate([left_pad(chosen[0], 0), left_pad(rejected[0], 0)])
  positions = jnp.concatenate(
    [left_pad(chosen[1], -1), left_pad(rejected[1], -1)]
  )
  r = score(params, tokens, positions, model_cfg)
  return -jnp.mean(jax.nn.log_sigmoid(r[:n] - r[n:]))


def preference_pairs(
  correct: np.ndarray,
  group_size: int,
  *,
  max_pairs: int,
  seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """(chosen, rejected) row indices: correct vs incorrect, same prompt.

  Rows are prompt-major groups of `group_size`. A group with c correct and
  w incorrect samples offers c * w pairs; up to `max_pairs` of them are
  drawn without replacement (deterministic in `seed`); a group that is all
  right or all wrong gives none.

  Returns:
    Two [M] int arrays (M = 0 when no group is mixed).
  """
  ok = np.asarray(correct, np.float32).reshape(-1, group_size) > 0
  rng = np.random.default_rng(seed)
  chosen, rejected = [], []
  for b, row in enumerate(ok):
    good, bad = np.flatnonzero(row), np.flatnonzero(~row)
    pairs = [(g, w) for g in good for w in bad]
    take = rng.permutation(len(pairs))[:max_pairs]
    chosen += [b * group_size + pairs[k][0] for k in take]
    rejected += [b * group_size + pairs[k][1] for k in take]
  return np.asarray(chosen, np.int64), np.asarray(rejected, np.int64)


def bt_update(
  model_cfg,
  optimizer,
  mesh=None,
  micro_batches: int = 1,
  compiler_options: dict | None = None,
):
  """The jitted Bradley-Terry step of train_bt: (params, optimizer state,
  chosen tokens, positions, rejected tokens, positions) -> (params, state,
  loss), the params and state donated (updated in place); activations
  split by batch on `mesh` (mesh.activation_mesh), as the policy's train
  step. `micro_batches` > 1 accumulates the gradient over that many
  micro-batches of the pairs (aggregation.accumulate, as the policy's
  step): one optimizer update of the same loss, one micro-batch's
  activations live at a time. `compiler_options`: its compile's (e.g.
  libtpu's temporaries budget, as the policy's train step takes
  --train_temp_budget_mib). The planner compiles it (plan/scoring.py).
  """

  def micro_loss(params, pairs):
    c_tok, c_pos, r_tok, r_pos = pairs
    loss = bradley_terry_loss(params, (c_tok, c_pos), (r_tok, r_pos), model_cfg)
    return loss / micro_batches, {}  # the mean over all pairs, summed

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def update(params, state, c_tok, c_pos, r_tok, r_pos):
    pairs = (c_tok, c_pos, r_tok, r_pos)
    with mesh_lib.activation_mesh(mesh):
      (loss, _), grads = aggregation.accumulate(
        grad_fn, params, pairs, micro_batches
      )
    upd, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, upd), state, loss

  return jax.jit(
    update, donate_argnums=(0, 1), compiler_options=compiler_options
  )


def train_bt(
  params: dict,
  model_cfg,
  chosen: tuple[np.ndarray, np.ndarray],
  rejected: tuple[np.ndarray, np.ndarray],
  *,
  steps: int,
  batch_size: int,
  lr: float,
  seed: int = 0,
  weight_decay: float = 0.0,
  log_every: int = 0,
  mesh=None,
  micro_batches: int = 1,
  compiler_options: dict | None = None,
  resume=None,
) -> tuple[dict, list[float]]:
  """Bradley-Terry training: minimises -log sigmoid(r(c) - r(r)) over pairs.

  Adam(W) on minibatches of `batch_size` pairs drawn without replacement,
  epoch after epoch (deterministic in `seed`); the whole model (backbone
  and head) is trained, as InstructGPT's reward model.

  Args:
    params: reward-model params (`init`).
    model_cfg: the backbone's ModelConfig.
    chosen, rejected: (tokens [M, S], positions [M, S]); pair i is
      (chosen row i, rejected row i).
    steps, batch_size, lr, seed, weight_decay: the optimisation.
    log_every: > 0 prints a progress line (loss, ETA) every that many steps.
    mesh: each minibatch's pairs split by rows over its batch axes and the
      activations laid out so (mesh.activation_mesh), as the policy's
      train step; None: where the params are.
    micro_batches: each step's gradient accumulated over this many
      micro-batches of its pairs (bt_update); it divides batch_size.
      With fewer than batch_size pairs in all, a step takes the largest
      multiple of it that there are pairs for (all of them, in one
      micro-batch, when there are fewer pairs than micro-batches).
    compiler_options: the step's compile options (bt_update).
    resume: a train.checkpoint.Resumable: SIGTERM or Ctrl-C checkpoints
      the training there (weights, Adam's state, draw order, losses) and
      raises its Stopped; a later call with the same arguments resumes it
      and ends as an uninterrupted one would.

  Returns:
    (params, [steps] training losses, each before its update).
  """
  m = len(chosen[0])
  if micro_batches < 1 or batch_size % micro_batches:
    raise ValueError(
      f"micro_batches={micro_batches} must be >= 1 and divide "
      f"batch_size={batch_size} (pairs per Bradley-Terry step)"
    )
  if m == 0 or steps == 0:
    return params, []
  rows = min(batch_size, m) // micro_batches * micro_batches
  if rows == 0:  # fewer pairs than micro-batches: one micro-batch of all
    rows, micro_batches = m, 1
  opt = optax.adamw(lr, weight_decay=weight_decay)
  # Own buffers, updated in place (bt_update donates them): the caller's
  # (the policy's weights as the backbone) stay valid, and one step holds
  # one copy of the weights and moments.
  params = jax.tree.map(jnp.copy, params)
  state = opt.init(params)
  update = bt_update(model_cfg, opt, mesh, micro_batches, compiler_options)
  rng = np.random.default_rng(seed)
  order = np.array([], np.int64)
  losses, start = [], 0
  if resume is not None:
    restored, meta = resume.restore((params, state))
    if restored is not None:
      (params, state), start = restored, meta["step"]
      rng.bit_generator.state = meta["rng"]
      order, losses = np.asarray(meta["order"], np.int64), meta["losses"]
      print(f"reward model: resuming from step {start}", flush=True)
  try:
    progress = metrics_lib.Progress(steps, start, label="reward model step")
    for step in range(start, steps):
      if len(order) < rows:
        order = np.concatenate([order, rng.permutation(m)])
      idx, order = order[:rows], order[rows:]
      pairs = (
        chosen[0][idx],
        chosen[1][idx],
        rejected[0][idx],
        rejected[1][idx],
      )
      if mesh is not None:
        pairs = mesh_lib.put_rows(mesh, pairs)
      params, state, loss = update(params, state, *pairs)
      losses.append(float(loss))
      if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
        progress.update(step + 1, {"loss": np.mean(losses[-log_every:])})
      if resume is not None:
        meta = lambda order=order: {  # noqa: E731 - called when it saves
          "order": order.tolist(),
          "losses": losses,
          "rng": rng.bit_generator.state,
        }
        resume.maybe_stop(step + 1, steps, (params, state), meta)
  finally:
    if resume is not None:
      resume.close()  # the handlers, however it ends
  return params, losses


def pairwise_accuracy(
  params: dict,
  chosen: tuple[np.ndarray, np.ndarray],
  rejected: tuple[np.ndarray, np.ndarray],
  model_cfg,
  *,
  batch_size: int = 256,
  mesh=None,
) -> float:
  """Fraction of pairs with r(chosen) > r(rejected), ties counting 1/2
  (NaN for no pairs); scored `batch_size` rows at a time (`scores`)."""
  if len(chosen[0]) == 0:
    return float("nan")
  kw = dict(rows=batch_size, mesh=mesh)
  rc = scores(params, *chosen, model_cfg, **kw)
  rr = scores(params, *rejected, model_cfg, **kw)
  return float(((rc > rr) + 0.5 * (rc == rr)).mean())


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
