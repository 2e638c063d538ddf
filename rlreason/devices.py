"""What a backend's devices hold and how programs compile for them.

  device_memory / device_free_memory   a device's memory limit and what is
                                       free of it (None where the backend
                                       does not say: CPUs, AOT devices)
  compile_options / options_jit        compiler options (libtpu's
                                       temporaries budget) for the functions
                                       jitted under a context
  jit_with_options                     one cached jit per body and options
  no_tpu_probe_without_tpus            a command line's first call: CPU
                                       only on a host with libtpu but no
                                       TPU (no probe, no warnings)
  CHIPS / GPUS / local_peaks           TPU chips' HBM, peak bf16 FLOP/s,
                                       HBM and ICI bandwidth; a local GPU's
                                       or TPU's peaks (the planner, a
                                       run's MFU: peak_flops)

No mesh axes are named here (mesh.py maps them).
"""

import contextlib
import contextvars
import dataclasses
import functools
import glob
import importlib.util
import os

import jax
from jax.sharding import Mesh


def device_memory(mesh: "Mesh") -> int | None:
  """Bytes of memory of one of this process's devices in `mesh`, or None
  where the backend does not say (CPUs; abstract AOT devices)."""
  local = set(jax.local_devices())
  device = next((d for d in mesh.devices.flat if d in local), None)
  if device is None:
    return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # noqa: BLE001 - backends without memory stats raise
    return None
  return stats.get("bytes_limit")


def out_of_memory(error: str) -> bool:
  """Whether an error's message says a program did not fit the device's
  memory: XLA's compile errors for TPU (the planner's) and its runtime
  errors on every backend."""
  markers = (
    "RESOURCE_EXHAUSTED",
    "Ran out of memory",
    "exceeds available",
    "Out of memory allocating",  # XLA:CPU at run time
  )
  return any(m in error for m in markers)


def total_memory() -> tuple[int | None, str]:
  """(bytes, what they are) of every device of the run together: the
  backend's per-device limit times the devices, or on a CPU the RAM of
  its hosts (its devices share it); None where neither is known."""
  device = jax.local_devices()[0]
  try:
    limit = (device.memory_stats() or {}).get("bytes_limit")
  except Exception:  # noqa: BLE001 - backends without memory stats raise
    limit = None
  n = jax.device_count()
  if limit:
    return limit * n, f"{n} {device.platform.upper()} device(s)"
  if device.platform != "cpu":
    return None, ""
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    return None, ""
  hosts = jax.process_count()
  return ram * hosts, "this host's RAM" if hosts == 1 else f"{hosts} hosts' RAM"


def peak_flops() -> float | None:
  """All the devices' peak bf16 FLOP/s (local_peaks of the first, times
  their count, every process's), or None where unknown (a CPU)."""
  peaks = local_peaks(jax.devices()[0])
  return None if peaks is None else peaks[0] * jax.device_count()


def device_free_memory(mesh: "Mesh") -> int | None:
  """Bytes not in use on one of this process's devices in `mesh` (the
  fullest one), or None where the backend does not say."""
  local = set(jax.local_devices())
  free = []
  for device in mesh.devices.flat:
    if device not in local:
      continue
    try:
      stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory stats raise
      return None
    if "bytes_limit" not in stats:
      return None
    free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  return min(free) if free else None


_COMPILE_OPTIONS: contextvars.ContextVar = contextvars.ContextVar(
  "rlreason_compile_options", default=None
)


@contextlib.contextmanager
def compile_options(options: dict | None):
  """Within it, functions jitted by `options_jit` compile with `options`
  (e.g. libtpu's temporaries budget, train_step.compiler_options: the
  whole-rollout forwards under --score_temp_budget_mib); None: their
  defaults."""
  token = _COMPILE_OPTIONS.set(options)
  try:
    yield options
  finally:
    _COMPILE_OPTIONS.reset(token)


def options_jit(**spec):
  """Decorator: jax.jit(fn, **spec), compiled with the innermost
  `compile_options`' options where called under one (jit_with_options)."""

  def wrap(body):
    default = jax.jit(body, **spec)

    @functools.wraps(body)
    def call(*args, **kwargs):
      options = _COMPILE_OPTIONS.get()
      if not options:
        return default(*args, **kwargs)
      return jit_with_options(body, options, **spec)(*args, **kwargs)

    return call

  return wrap


def jit_with_options(body, options: dict, **spec):
  """jax.jit(body, compiler_options=options, **spec), one per body,
  options and spec (cached: calls with the same shapes never recompile)."""
  options, spec = tuple(sorted(options.items())), tuple(sorted(spec.items()))
  return _jit_with(body, options, spec)


@functools.cache
def _jit_with(body, options: tuple, spec: tuple):
  return jax.jit(body, compiler_options=dict(options), **dict(spec))


def no_tpu_probe_without_tpus() -> None:
  """Skips JAX's TPU backend on a host with no TPU (and no GPU plugin).

  libtpu comes with the test extra (the planner AOT-compiles for TPU
  slices); without this, JAX probes for TPUs when its backend starts and
  prints libtpu's warnings and an INVALID_ARGUMENT error on every CPU run.
  Each command line calls it before its first JAX computation (an
  experiment's flags.run_main, the evaluation, benchmark and reproduction
  CLIs). JAX_PLATFORMS or TPU_ACCELERATOR_TYPE, when set, win.
  """
  if os.environ.get("JAX_PLATFORMS") or os.environ.get("TPU_ACCELERATOR_TYPE"):
    return
  if importlib.util.find_spec("libtpu") is None:
    return
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  if any(
    importlib.util.find_spec(m) is not None
    for m in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm_plugin")
  ):
    return
  jax.config.update("jax_platforms", "cpu")


# --- Peaks: TPU chips (the planner's slices are made of them) and GPUs ---

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bandwidth: float  # bytes/s
  cores_per_chip: int  # TensorCores the slice name counts per chip
  dims: int  # 3 (torus) or 2 (mesh) chip topology
  # Bidirectional ICI bytes/s per chip, all its links together (v4: six
  # links of 50 GB/s each way, the v4 paper; the others as published).
  ici_bandwidth: float = 0.0


CHIPS = {
  "v4": Chip("v4", 32 * GIB, 275e12, 1.2e12, 2, 3, 600e9),
  "v5e": Chip("v5e", 16 * GIB, 197e12, 0.819e12, 1, 2, 400e9),
  "v5p": Chip("v5p", 95 * GIB, 459e12, 2.765e12, 2, 3, 1200e9),
  "v6e": Chip("v6e", 32 * GIB, 918e12, 1.64e12, 1, 2, 800e9),
}

# GPUs, for the planner's "local" topology: (a substring of JAX's
# device_kind, dense bf16 FLOP/s, HBM bytes/s), most specific first;
# NVIDIA's datasheets (SXM parts unless named).
GPUS = (
  ("H100 PCIe", 756e12, 2.0e12),
  ("H100", 989e12, 3.35e12),
  ("H200", 989e12, 4.8e12),
  ("A100", 312e12, 2.039e12),
  ("L4", 121e12, 0.3e12),
)


# TPUs' JAX device_kind -> CHIPS (one megacore device per v4 / v5p chip),
# most specific first.
TPU_KINDS = (
  ("TPU v5 lite", "v5e"),
  ("TPU v5e", "v5e"),
  ("TPU v6 lite", "v6e"),
  ("TPU v6e", "v6e"),
  ("TPU v5p", "v5p"),
  ("TPU v5", "v5p"),
  ("TPU v4", "v4"),
)


def local_peaks(device) -> tuple[float, float] | None:
  """(peak bf16 FLOP/s, HBM bytes/s) of a local GPU or TPU device from its
  device_kind; None when unknown (CPU, other chips)."""
  kind = getattr(device, "device_kind", "")
  for name, flops, bandwidth in GPUS:
    if name in kind:
      return flops, bandwidth
  for name, family in TPU_KINDS:
    if kind.startswith(name):
      return CHIPS[family].peak_flops, CHIPS[family].hbm_bandwidth
  return None
