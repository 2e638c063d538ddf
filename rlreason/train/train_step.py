"""The jitted train step: gradient accumulation, optax update, NaN guard.

  optimizer = optimizer.make_optimizer(lr=1e-6, total_steps=500)
  state = init_state(params, optimizer)
  step = make_train_step(loss_fn, optimizer, state_sharding=...,
                         batch_sharding=..., micro_batches=4)
  state, metrics = step(state, batch)   # `state` is donated
  state, metrics = run_updates(step, state, host_batch, batch_sharding,
                               epochs=1, minibatches=2, rng=rng)

`loss_fn(params, batch, norm) -> (loss, metrics)` is pure with every method
choice bound in. `batch` is a dict of [N, ...] arrays with at least "mask"
[N, T]. `norm` holds the denominators of the WHOLE minibatch
(`aggregation.normalizers`: num_tokens, num_seqs), computed before the split
into micro-batches, so the summed micro-batch losses and gradients equal the
full-batch ones for every aggregation mode (DESIGN.md principle 6).
"""

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.rl import aggregation
from rlreason import mesh as mesh_lib
from rlreason.model import transformer
from rlreason.train import optimizer as optimizer_lib

LossFn = Callable[[Any, dict, dict], tuple[jax.Array, dict]]


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # [] int32, optimizer updates attempted


def init_state(params, optimizer) -> TrainState:
  return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def state_shardings(
  mesh, params_axes, params_shapes, optimizer, rules=mesh_lib.TRAIN_RULES
) -> TrainState:
  """Shardings of a TrainState; optimizer moments inherit the param axes."""
  param_sh = mesh_lib.shardings(mesh, params_axes, rules, params_shapes)
  opt_shapes = jax.eval_shape(optimizer.init, params_shapes)
  return TrainState(
    param_sh,
    optimizer_lib.moment_shardings(optimizer, opt_shapes, param_sh, mesh),
    mesh_lib.replicated(mesh),
  )


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]
  return jnp.stack(leaves).all() if leaves else jnp.array(True)


# libtpu's bound on a program's HLO temporaries (MiB). Without it the TPU
# compiler's latency-hiding scheduler keeps more buffers live (collectives
# and recomputation overlapped across layers) whenever the chip's HBM
# allows: a long-context train step's temporaries then fill the HBM at any
# rows per chip. With it, the compiler schedules (and rematerialises) to
# stay under the bound, or fails with out-of-memory.
BUDGET_OPTION = "xla_tpu_max_hbm_size_mib"


def compiler_options(budget_mib: int, mesh) -> dict | None:
  """A program's compile options: libtpu's temporaries budget on TPU
  (--train_temp_budget_mib for the train step, --rollout_temp_budget_mib
  for the sampler, --score_temp_budget_mib for the whole-rollout forwards),
  none elsewhere or at 0."""
  if not budget_mib or mesh is None:
    return None
  if mesh.devices.flat[0].platform != "tpu":
    return None
  return {BUDGET_OPTION: str(budget_mib)}


def make_train_step(
  loss_fn: LossFn,
  optimizer: optax.GradientTransformation,
  *,
  state_sharding=None,
  batch_sharding=None,
  micro_batches: int = 1,
  donate: bool = True,
  frozen_sharding=None,
  options: dict | None = None,
  groups: tuple[str, ...] | None = None,
):
  """Returns jitted `step(state, batch) -> (state, metrics)`, or
  `step(state, batch, frozen)` with frozen_sharding (parameters that are
  not trained, e.g. LoRA's base: `loss_fn(params, batch, norm, frozen)`).

  `groups` (of a `grouped` optimizer, e.g. (POLICY,) or ("critic",))
  makes a step that trains those groups alone: loss_fn gets their params
  only (and is differentiated by them), the other params and their
  optimizer state are kept as they are.

  Non-finite loss or gradients, or a batch with a nonzero "skip" row (the
  loop's mark of non-finite rewards), skip the update (params and optimizer
  state are kept) and report `skipped = 1`; the step counter still
  advances. A batch with no token to learn from (every mask of it all 0:
  groups all filtered out, no sample kept) is no update either, reported
  as `empty = 1`: Adam's moments would otherwise move the weights on zero
  gradients, and weight decay shrink them.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch: dict, *frozen):
    # The whole minibatch's counts of its masks (a critic's value_mask too).
    masks = {k: v for k, v in batch.items() if k.endswith("_mask")}
    norm = aggregation.normalizers(batch["mask"], **masks)
    trained = state.params
    if groups is not None:
      trained = {
        k: v
        for k, v in state.params.items()
        if optimizer_lib.group_of(k, state.opt_state) in groups
      }
    (loss, metrics), grads = aggregation.accumulate(
      grad_fn, trained, batch, micro_batches, norm, *frozen
    )
    ok = jnp.isfinite(loss) & _all_finite(grads)
    if "skip" in batch:  # [N] rows of a step the loop skips (bad rewards)
      ok &= jnp.max(batch["skip"]) == 0
    counts = [v for k, v in norm.items() if k.endswith("_tokens")]
    learns = functools.reduce(jnp.logical_or, [c > 0 for c in counts])
    # Zeroed gradients keep NaN out of the optimizer state on a skipped step.
    safe_grads = jax.tree.map(lambda g: jnp.where(ok, g, 0.0), grads)
    updates, opt_state = optimizer.update(safe_grads, state.opt_state, trained)
    keep = lambda new, old: jax.tree.map(
      lambda n, o: jnp.where(ok & learns, n, o), new, old
    )
    params = optax.apply_updates(trained, updates)
    new_state = TrainState(
      {**state.params, **keep(params, trained)},
      keep(opt_state, state.opt_state),
      state.step + 1,
    )
    metrics = {
      **metrics,
      "loss": loss,
      # NaN on a skipped step: no update was made with any gradient.
      "grad_norm": jnp.where(ok, optax.tree.norm(safe_grads), jnp.nan),
      "skipped": 1.0 - ok.astype(jnp.float32),
      "empty": 1.0 - learns.astype(jnp.float32),
    }
    return new_state, metrics

  kwargs = {}
  if state_sharding is not None:
    frozen = () if frozen_sharding is None else (frozen_sharding,)
    kwargs = dict(
      in_shardings=(state_sharding, batch_sharding, *frozen),
      out_shardings=(state_sharding, None),
    )
  mesh = getattr(batch_sharding, "mesh", None)

  def step_on_mesh(state, batch, *frozen):
    # The model keeps activations split by batch on the step's mesh.
    with mesh_lib.activation_mesh(mesh):
      return step(state, batch, *frozen)

  if options:  # compiler_options(): libtpu's flags for this program alone
    kwargs["compiler_options"] = options
  return jax.jit(step_on_mesh, donate_argnums=0 if donate else (), **kwargs)


def run_updates(
  step_fn,
  state: TrainState,
  batch: dict,
  batch_sharding,
  *,
  epochs: int,
  minibatches: int,
  rng: np.random.Generator,
  progress: Callable[[int], None] | None = None,
  rows: int = 0,
) -> tuple[TrainState, list[dict]]:
  """`epochs` passes over `batch` (host [N, ...] arrays), each in
  `minibatches` minibatches of rows in `rng`'s order (in order for one),
  one `step_fn` call each: (state, every call's metrics on the host).
  `rows` > 0: each minibatch is that many rows, and the order's rows after
  minibatches * rows are not used in that epoch (group_minibatch).
  `progress(updates done)` after each but the last, once it has run (so
  that a line tells the device's pace)."""
  metrics, total = [], epochs * minibatches
  n = len(batch["mask"])
  rows = rows or n // minibatches
  for _ in range(epochs):
    order = rng.permutation(n) if minibatches > 1 else np.arange(n)
    for part in np.split(order[: minibatches * rows], minibatches):
      mb = {k: v[part] for k, v in batch.items()}
      state, m = step_fn(state, mesh_lib.put_global(mb, batch_sharding))
      metrics.append(m)
      if progress is not None and len(metrics) < total:
        jax.block_until_ready(m)
        progress(len(metrics))
  return state, mesh_lib.to_host(metrics)


def setup(
  mesh,
  model_cfg,
  params,
  optimizer,
  loss_fn: LossFn,
  *,
  micro_batches: int = 1,
  axes=None,
  frozen=None,
  frozen_axes=None,
  temp_budget_mib: int = 0,
  groups: tuple[str, ...] | None = None,
):
  """(sharded TrainState, jitted step, batch sharding) for `params`.

  The state is laid out by mesh.TRAIN_RULES; the step donates it. `axes`
  (logical axes with the structure of `params`) is needed when `params`
  holds more than the model's parameters (e.g. a critic, value.py).
  `frozen` (with its logical `frozen_axes`) is passed to every step as
  loss_fn's fourth argument, laid out by TRAIN_RULES, never updated.
  `temp_budget_mib` bounds the step's temporaries on TPU (BUDGET_OPTION).
  `groups`: the step trains those optimizer groups alone (make_train_step).
  """
  if axes is None:
    axes, shapes = (
      transformer.param_axes(model_cfg),
      transformer.param_shapes(model_cfg),
    )
  else:
    shapes = jax.eval_shape(lambda p: p, params)
  state_sh = state_shardings(mesh, axes, shapes, optimizer)
  state = jax.jit(
    functools.partial(init_state, optimizer=optimizer), out_shardings=state_sh
  )(params)
  batch_sh = mesh_lib.batch_sharding(mesh, 1)
  frozen_sh = None
  if frozen is not None:
    frozen_sh = mesh_lib.shardings(
      mesh,
      frozen_axes,
      mesh_lib.TRAIN_RULES,
      jax.eval_shape(lambda f: f, frozen),
    )
  step = make_train_step(
    loss_fn,
    optimizer,
    state_sharding=state_sh,
    batch_sharding=batch_sh,
    micro_batches=micro_batches,
    frozen_sharding=frozen_sh,
    options=compiler_options(temp_budget_mib, mesh),
    groups=groups,
  )
  if frozen is not None:
    jitted = step
    step = lambda state, batch: jitted(state, batch, frozen)  # noqa: E731
  return state, step, batch_sh


def batch_shards(cfg, devices: int) -> int:
  """The batch shards of the config's mesh over `devices` chips: all but
  the tensor axis (mesh_lib.batch_divisor's count, without a mesh)."""
  return devices // max(cfg.mesh_tensor, 1)


def micro_batch_rows(cfg) -> int:
  """Rows per train micro-batch: N over minibatches and micro-batches."""
  return cfg.num_sequences // (cfg.minibatches * cfg.micro_batches)


def unsplit(cfg, shards: int) -> str:
  """Why the train step's micro-batch does not split over `shards` batch
  shards, or "". XLA then keeps its activations whole on groups of chips:
  the planner's v4 cells at 4-30 rows over 8-32 chips had a roofline
  train MFU of 13-53% (their compiled bytes), every other v4 cell 75%;
  planned with splitting_micro_batches' count, all ten reach 75%."""
  rows = micro_batch_rows(cfg)
  if shards <= 1 or rows % shards == 0:
    return ""
  return f"{rows} rows per micro-batch do not split over {shards} chips"


def splitting_micro_batches(cfg, shards: int) -> int:
  """The fewest micro-batches whose rows split over `shards` batch shards
  and are no more than max(rows now, shards): the config's own count when
  its rows split already, 0 when the minibatch itself does not split."""
  m = cfg.num_sequences // cfg.minibatches  # rows per minibatch
  rows = m // cfg.micro_batches
  if shards <= 1 or rows % shards == 0:
    return cfg.micro_batches
  if m % shards:
    return 0
  cap = max(rows, shards)
  per_shard = m // shards
  return min(
    d for d in range(1, per_shard + 1) if per_shard % d == 0 and m // d <= cap
  )


def group_minibatch(cfg, minibatches: int, shards: int) -> tuple[int, int]:
  """(rows, micro-batches) of each minibatch of a group that takes
  `minibatches` updates an epoch on its own (optimizer.make_optimizer's
  group_steps): N / minibatches rows, cut to a whole number of the train
  step's micro-batches (micro_batch_rows: sized for memory) that splits
  over the `shards` batch shards, or, when fewer, to a whole number of
  shards in one micro-batch. The rows cut off are not used in that epoch,
  as Open-Reasoner-Zero's critic leaves out the micro-batches that do not
  fill its last update; 0 rows when not even one per shard is left."""
  n, unit = cfg.num_sequences // minibatches, max(1, micro_batch_rows(cfg))
  whole = math.lcm(unit, max(1, shards))  # micro-batches that split
  if n >= whole:
    return n - n % whole, (n - n % whole) // unit
  return n - n % max(1, shards), 1


def score_rows(cfg, mesh) -> int:
  """Rows per whole-rollout forward: the train step's micro-batch, which
  the run already sized to fit memory, rounded up to a multiple of the
  batch shards (a micro-batch of fewer rows than chips is still split)."""
  rows = max(1, micro_batch_rows(cfg))
  shards = mesh_lib.batch_divisor(mesh)
  return -(-rows // shards) * shards
