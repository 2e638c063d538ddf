"""Bradley-Terry training of the scalar reward model (rewards/model.py).

InstructGPT (arXiv:2203.02155, Sec. 3.5): the loss -log sigmoid(r(chosen) -
r(rejected)), i.e. P(chosen > rejected) = sigmoid(r(chosen) -
r(rejected)), minimised by minibatch Adam (`train_bt`, the jitted step
`bt_update`); `pairwise_accuracy` is the held-out metric InstructGPT
reports, ties counted half. `preference_pairs` builds pairs from sampled
groups with a verifier: chosen = a correct sample, rejected = an incorrect
one for the same prompt. `train_bt(groups=...)` batches a prompt's pairs
together, each prompt weighted alike, as InstructGPT does.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.rewards import model
from rlreason.rl import aggregation


def bradley_terry_loss(
  params, chosen, rejected, model_cfg, weights=None
) -> jax.Array:
  """Mean -log sigmoid(r(chosen) - r(rejected)); each a (tokens, positions)
  pair of [N, S] arrays (widths may differ: the narrower is left-padded,
  positions -1). `weights` [N]: the sum of weights x -log sigmoid instead
  (weights summing to 1 over a step: its weighted mean). Both sides in
  one forward of 2N rows: the model's weights are read (gathered, on a
  mesh) once per step, not twice. The head's bias
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
  r = model.score(params, tokens, positions, model_cfg)
  log_p = jax.nn.log_sigmoid(r[:n] - r[n:])
  return -(jnp.mean(log_p) if weights is None else jnp.sum(weights * log_p))


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
  chosen tokens, positions, rejected tokens, positions, weights) ->
  (params, state, loss), the loss the weights' sum over the pairs (they
  sum to 1: a weighted mean), the params and state donated (updated in
  place); activations split by batch on `mesh` (mesh.activation_mesh),
  as the policy's train step. `micro_batches` > 1 accumulates the
  gradient over that many micro-batches of the pairs
  (aggregation.accumulate, as the policy's step): one optimizer update of
  the same loss, one micro-batch's activations live at a time.
  `compiler_options`: its compile's (e.g. libtpu's temporaries budget, as
  the policy's train step takes --train_temp_budget_mib). The planner
  compiles it (plan/scoring.py).
  """

  def micro_loss(params, pairs):
    c_tok, c_pos, r_tok, r_pos, w = pairs
    chosen, rejected = (c_tok, c_pos), (r_tok, r_pos)
    # The step's weights: micro-batches' sums add up to its loss.
    return bradley_terry_loss(params, chosen, rejected, model_cfg, w), {}

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def update(params, state, c_tok, c_pos, r_tok, r_pos, weights):
    pairs = (c_tok, c_pos, r_tok, r_pos, weights)
    with mesh_lib.activation_mesh(mesh):
      (loss, _), grads = aggregation.accumulate(
        grad_fn, params, pairs, micro_batches
      )
    upd, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, upd), state, loss

  return jax.jit(
    update, donate_argnums=(0, 1), compiler_options=compiler_options
  )


SCHEDULES = ("constant", "cosine")


def learning_rate(lr: float, steps: int, schedule: str) -> optax.Schedule:
  """train_bt's learning rate by step: `lr` throughout ("constant"), or
  InstructGPT's for its reward model (its App. C: a cosine decay to 10% of
  the initial rate by the end of training): lr at step 0, lr / 10 at
  `steps` ("cosine")."""
  if schedule == "constant":
    return optax.constant_schedule(lr)
  if schedule == "cosine":
    return optax.cosine_decay_schedule(lr, max(steps, 1), alpha=0.1)
  raise ValueError(f"schedule={schedule!r}; expected one of {SCHEDULES}")


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
  groups: np.ndarray | None = None,
  schedule: str = "constant",
) -> tuple[dict, list[float]]:
  """Bradley-Terry training: minimises -log sigmoid(r(c) - r(r)) over pairs.

  Adam(W) on minibatches of `batch_size` pairs drawn without replacement,
  epoch after epoch (deterministic in `seed`), each pair weighted alike;
  the whole model (backbone and head) is trained, as InstructGPT's
  reward model. With `groups`, InstructGPT's batching instead (its Sec.
  3.5: a prompt's comparisons are one batch element, as shuffled ones
  overfit): a step draws whole prompts, every pair of a prompt in the
  same step, while the next prompt's pairs still fit in `batch_size`;
  each prompt weighs alike (a pair 1 / its prompt's pairs / the step's
  prompts) and the slots left over are weight-0 copies of a drawn pair.

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
    groups: [M] the prompt of each pair (any ids), or None.
    schedule: constant or cosine, the learning rate over the steps
      (`learning_rate`).

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
  # What a step draws: single pairs, or (groups) every pair of a prompt.
  units = np.arange(m)[:, None]
  if groups is not None:
    _, of = np.unique(np.asarray(groups), return_inverse=True)
    by_prompt = np.argsort(of, kind="stable")
    units = np.split(by_prompt, np.cumsum(np.bincount(of))[:-1])
    most = max(len(u) for u in units)
    if most > rows:
      raise ValueError(
        f"a prompt has {most} preference pairs, more than a step's {rows} "
        f"(batch_size={batch_size}, micro_batches={micro_batches}): its "
        "pairs must fit in one step"
      )
  opt = optax.adamw(
    learning_rate(lr, steps, schedule), weight_decay=weight_decay
  )
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
        order = np.concatenate([order, rng.permutation(len(units))])
      k, size = 0, 0
      while k < len(order) and size + len(units[order[k]]) <= rows:
        size, k = size + len(units[order[k]]), k + 1
      idx, weights = _step_pairs([units[u] for u in order[:k]], rows)
      order = order[k:]
      pairs = (
        chosen[0][idx],
        chosen[1][idx],
        rejected[0][idx],
        rejected[1][idx],
        weights,
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


def _step_pairs(drawn: list, rows: int) -> tuple[np.ndarray, np.ndarray]:
  """A step's `rows` pair indices and weights from the drawn units (each
  an array of pairs, weighed alike and split evenly among its pairs);
  the slots left over repeat the first pair at weight 0."""
  idx = np.concatenate(drawn)
  w = np.concatenate(
    [np.full(len(u), 1 / (len(u) * len(drawn))) for u in drawn]
  )
  pad = rows - len(idx)
  idx = np.concatenate([idx, np.full(pad, idx[0], idx.dtype)])
  return idx, np.concatenate([w, np.zeros(pad)]).astype(np.float32)


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
  rc = model.scores(params, *chosen, model_cfg, **kw)
  rr = model.scores(params, *rejected, model_cfg, **kw)
  return float(((rc > rr) + 0.5 * (rc == rr)).mean())
