"""Device mesh and logical-axis sharding rules. The only file naming mesh axes.

Model code names logical axes ("embed", "heads", ...). Two short tables map
them to the mesh axes (data, fsdp, tensor):

  TRAIN_RULES    FSDP over `fsdp` plus tensor parallelism over `tensor`;
                 the batch over (data, fsdp).
  ROLLOUT_RULES  parameters replicated over data / fsdp and split over
                 `tensor`, so decoding needs no parameter all-gathers;
                 the batch over (data, fsdp).

Activations carry logical axes too (ACTIVATION_RULES): under
`activation_mesh(mesh)` the model constrains its residual stream and MLP
activations with `constrain`, so they stay split by batch over (data, fsdp)
and XLA never follows the parameters' embed -> fsdp split into replicating
a whole micro-batch on every device. Without an active mesh (one device,
tests of the bare model) `constrain` is the identity.

The same code runs on 1 CPU, 8 simulated CPU devices, a TPU slice or GPUs.
"""

import contextlib
import contextvars
import functools
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlreason import devices

AXES = ("data", "fsdp", "tensor")

TRAIN_RULES: dict[str, Any] = {
  "batch": ("data", "fsdp"),
  "vocab": "tensor",
  "embed": "fsdp",
  "mlp": "tensor",
  "heads": "tensor",
  "kv_heads": "tensor",
  "head_dim": None,
  "norm": None,
  "seq": None,
}

ROLLOUT_RULES: dict[str, Any] = {
  **TRAIN_RULES,
  "embed": None,
}


# The rollout's fallback when replicated parameters would not fit: FSDP as in
# training (decode steps all-gather each layer's weights, as training does).
ROLLOUT_FSDP_RULES: dict[str, Any] = dict(TRAIN_RULES)
# Replicated rollout parameters may take this much of a device's memory; the
# rest is left to the KV cache and activations.
ROLLOUT_PARAM_FRACTION = 0.4


# The rollout's parameter layouts (--rollout_layout): auto chooses by
# memory (rollout_rules), replicated and fsdp force one.
ROLLOUT_LAYOUTS = ("auto", "replicated", "fsdp")


def rollout_rules(
  mesh: "Mesh", param_bytes: int, device_bytes=None, layout: str = "auto"
) -> dict:
  """ROLLOUT_RULES when the parameters, split over `tensor` only, take at
  most ROLLOUT_PARAM_FRACTION of a device's memory; else ROLLOUT_FSDP_RULES.
  `layout` "replicated" / "fsdp" (ROLLOUT_LAYOUTS) chooses one instead:
  fsdp leaves the memory of the replicas to the KV cache, and each decode
  step all-gathers the weights over the chips (the planner times it).

  `device_bytes` defaults to the device's reported limit (TPUs and GPUs;
  CPUs report none: replicated).
  """
  if layout not in ROLLOUT_LAYOUTS:
    raise ValueError(
      f"rollout layout {layout!r}; expected one of {ROLLOUT_LAYOUTS}"
    )
  if layout != "auto":
    return ROLLOUT_RULES if layout == "replicated" else ROLLOUT_FSDP_RULES
  if device_bytes is None:
    device_bytes = devices.device_memory(mesh)
  if replicates(param_bytes, mesh.shape["tensor"], device_bytes):
    return ROLLOUT_RULES
  return ROLLOUT_FSDP_RULES


def replicates(param_bytes: int, tensor: int, device_bytes) -> bool:
  """The auto rollout layout's choice: weights of `param_bytes` split over
  `tensor` devices are replicated over data / fsdp where they take at most
  ROLLOUT_PARAM_FRACTION of `device_bytes` (or where that is unknown)."""
  if not device_bytes:
    return True
  return param_bytes / tensor <= ROLLOUT_PARAM_FRACTION * device_bytes


# Activations: split by batch; hidden / mlp / heads follow tensor parallelism.
ACTIVATION_RULES: dict[str, Any] = {
  "batch": ("data", "fsdp"),
  "seq": None,
  # The residual stream's tokens under sequence parallelism
  # (ModelConfig.sequence_parallel; blocks.RESIDUAL_SPLIT).
  "seq_split": "tensor",
  "embed": None,
  "mlp": "tensor",
  "heads": "tensor",
  "kv_heads": "tensor",
  "head_dim": None,
  "vocab": "tensor",
}

_ACTIVE_MESH: contextvars.ContextVar = contextvars.ContextVar(
  "rlreason_activation_mesh", default=None
)


@contextlib.contextmanager
def activation_mesh(mesh: "Mesh | None"):
  """Within it, `constrain` lays activations out on `mesh` (while a jitted
  function is traced: wrap the traced body, or the call that traces it)."""
  token = _ACTIVE_MESH.set(mesh)
  try:
    yield mesh
  finally:
    _ACTIVE_MESH.reset(token)


def active_mesh() -> "Mesh | None":
  """The mesh of the innermost `activation_mesh`, or None."""
  return _ACTIVE_MESH.get()


def constrain(x: jax.Array, axes: tuple) -> jax.Array:
  """x constrained to its logical activation `axes` on the active mesh
  (identity without one; indivisible dimensions stay replicated)."""
  mesh = _ACTIVE_MESH.get()
  if mesh is None or mesh.size == 1:
    return x
  s = spec(axes, ACTIVATION_RULES, x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))


def vocab_axes(vocab: int) -> tuple[str, ...]:
  """The active mesh's axes (all of them, in order) when their product
  divides `vocab` and the mesh has more than one device, else (): a
  vocab-parallel projection splits V over every device."""
  mesh = _ACTIVE_MESH.get()
  if mesh is None or mesh.size == 1 or vocab % mesh.size:
    return ()
  return tuple(mesh.axis_names)


def constrain_spec(x: jax.Array, spec_: P) -> jax.Array:
  """x laid out as `spec_` (a PartitionSpec) on the active mesh (identity
  without one)."""
  mesh = _ACTIVE_MESH.get()
  if mesh is None or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec_))


def make_mesh(
  data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None
) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 to take the rest."""
  devices = jax.devices() if devices is None else devices
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got {sizes}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"Mesh sizes must be positive or -1, got {sizes}")
  if -1 in sizes:
    known = -math.prod(sizes)
    if len(devices) % known:
      raise ValueError(
        f"{len(devices)} devices cannot be split into mesh "
        f"{dict(zip(AXES, sizes))}"
      )
    sizes[sizes.index(-1)] = len(devices) // known
  if -1 not in (data, fsdp, tensor) and math.prod(sizes) < len(devices):
    # Every size explicit and smaller than the host: use the first devices
    # (e.g. --mesh_fsdp=1 for a single-device run on a multi-device host).
    devices = devices[: math.prod(sizes)]
  if math.prod(sizes) != len(devices):
    raise ValueError(
      f"Mesh {dict(zip(AXES, sizes))} needs "
      f"{math.prod(sizes)} devices, {len(devices)} available"
    )
  # Auto axes: classic jit with in/out shardings. (jax.make_mesh defaults to
  # Explicit axes in recent JAX, which changes how sharding propagates.)
  try:
    return jax.make_mesh(
      sizes, AXES, axis_types=(AxisType.Auto,) * 3, devices=devices
    )
  except NotImplementedError:
    # TPU chips whose physical axes do not factor into these sizes (fsdp
    # 8 x tensor 2 on v6e-16's 4x4 chips): split a physical axis.
    from jax.experimental import mesh_utils

    grid = mesh_utils.create_device_mesh(
      sizes, devices, allow_split_physical_axes=True
    )
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 3)


@functools.lru_cache(maxsize=8)
def rollout_mesh(mesh: Mesh, tensor: int = 0) -> Mesh:
  """The sampler's own mesh (--rollout_tensor): `mesh`'s devices in their
  order (one device assignment, so one jit reshards between the two; each
  tensor group consecutive, ICI neighbours) as (data, rest, `tensor`);
  0 or the mesh's own tensor size: `mesh` itself."""
  if tensor in (0, mesh.shape["tensor"]):
    return mesh
  data = mesh.shape["data"]
  rest = mesh.size // data
  if tensor < 0 or rest % tensor:
    raise ValueError(
      f"--rollout_tensor={tensor} must divide the {rest} devices of each "
      f"data replica of mesh {dict(mesh.shape)}"
    )
  grid = np.asarray(mesh.devices).reshape(data, rest // tensor, tensor)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 3)


def is_axes(x) -> bool:
  """True for a logical-axes leaf: a tuple of axis names (or None)."""
  return isinstance(x, tuple) and all(
    a is None or isinstance(a, str) for a in x
  )


def spec(axes: tuple, rules: dict, shape=None, mesh: Mesh | None = None) -> P:
  """Logical axes -> PartitionSpec.

  With `shape` and `mesh`, a dimension that the mapped mesh axes do not
  divide is replicated instead (e.g. 2 kv heads over tensor=4), and a mesh
  axis is never used twice.
  """
  used = set()
  out = []
  for i, name in enumerate(axes):
    if name is not None and name not in rules:
      raise ValueError(
        f"Logical axis {name!r} has no rule; rules cover {sorted(rules)}"
      )
    mapped = rules.get(name) if name is not None else None
    if mapped is None:
      out.append(None)
      continue
    mesh_axes = (mapped,) if isinstance(mapped, str) else tuple(mapped)
    mesh_axes = tuple(a for a in mesh_axes if a not in used)
    if shape is not None and mesh is not None:
      size = math.prod(mesh.shape[a] for a in mesh_axes)
      if shape[i] % size:
        out.append(None)
        continue
    used.update(mesh_axes)
    out.append(
      mesh_axes if len(mesh_axes) > 1 else (mesh_axes[0] if mesh_axes else None)
    )
  return P(*out)


def shardings(mesh: Mesh, axes_tree, rules: dict = TRAIN_RULES, shapes=None):
  """Pytree of logical-axes tuples -> pytree of NamedShardings.

  `shapes` (a matching pytree of arrays or ShapeDtypeStructs) lets
  indivisible dimensions fall back to replication.
  """
  if shapes is None:
    return jax.tree.map(
      lambda a: NamedSharding(mesh, spec(a, rules)), axes_tree, is_leaf=is_axes
    )
  return jax.tree.map(
    lambda a, s: NamedSharding(mesh, spec(a, rules, s.shape, mesh)),
    axes_tree,
    shapes,
    is_leaf=is_axes,
  )


def batch_sharding(mesh: Mesh, ndim: int, rules: dict = TRAIN_RULES):
  """Sharding of a [N, ...] array split over the batch axes."""
  return NamedSharding(mesh, spec(("batch",) + (None,) * (ndim - 1), rules))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh, rules: dict = TRAIN_RULES) -> int:
  """How many shards the batch axis is split into."""
  mapped = rules["batch"]
  names = (mapped,) if isinstance(mapped, str) else tuple(mapped)
  return int(np.prod([mesh.shape[a] for a in names]))


def to_host(tree):
  """Device arrays -> numpy, gathering across processes when needed.

  On one host this is jax.device_get. With several processes, an array
  sharded over devices of other hosts is all-gathered so every process gets
  the full value (they all run the same host-side code on it).
  """

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils

      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree.map(get, tree)


def from_process_0(value: Any) -> Any:
  """Process 0's JSON-able `value` on every process (each passes its own;
  the others' are ignored): what one process read from its disk (a resumed
  evaluation's journal) shared without assuming storage every host sees.
  On one process, `value` itself."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils

  data = json.dumps(value).encode() if jax.process_index() == 0 else b""
  # int32 words (every backend's collectives reduce them), length first.
  n = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
  words = np.zeros(-(-n // 4), np.int32)
  words.view(np.uint8)[: len(data)] = np.frombuffer(data, np.uint8)
  words = np.asarray(multihost_utils.broadcast_one_to_all(words))
  return json.loads(words.view(np.uint8)[:n].tobytes().decode())


def put_global(tree, sharding):
  """Host values (identical on every process) -> global arrays on `sharding`.

  Leaves are numpy arrays, scalars or process-local jax arrays (PRNG keys
  included). On one host this is jax.device_put. With several processes,
  each contributes only the shards its own devices hold.
  """

  def put(x):
    if not isinstance(x, jax.Array):
      x = np.asarray(x)
    if sharding.is_fully_addressable:
      return jax.device_put(x, sharding)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      # Keys travel as their raw uint32 data.
      data = put(jax.random.key_data(x))
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

  return jax.tree.map(put, tree)


def put_rows(mesh: Mesh | None, tree):
  """Host [N, ...] arrays -> device arrays split by rows over the rollout
  batch axes of `mesh` (replicated where N does not divide; mesh None: the
  default device). Multi-turn and tree rollouts put their per-row inputs
  back this way between host-side steps. Arrays already on a mesh (the
  sampler's, rollout_mesh) move there device to device.
  """
  if mesh is None:
    return jax.tree.map(jnp.asarray, tree)

  def put(x):
    axes = ("batch",) + (None,) * (np.ndim(x) - 1)
    sharding = NamedSharding(mesh, spec(axes, ROLLOUT_RULES, np.shape(x), mesh))
    if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
      return jax.device_put(x, sharding)
    return put_global(np.asarray(x), sharding)

  return jax.tree.map(put, tree)
