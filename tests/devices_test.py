"""devices.py: device memory where the backend reports it, and compiler
options for the functions jitted under a context."""

import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import devices
from rlreason import mesh as mesh_lib


def test_device_memory_is_none_where_the_backend_does_not_say():
  assert devices.device_memory(mesh_lib.make_mesh(1, -1, 1)) is None  # CPU


class _Device:
  def __init__(self, stats, platform="gpu"):
    self.stats = stats
    self.platform = platform

  def memory_stats(self):
    if isinstance(self.stats, Exception):
      raise self.stats
    return self.stats


def _mesh_of(monkeypatch, *stats, remote=0):
  """A stand-in mesh of fake devices, the first `remote` of them another
  process's (not in jax.local_devices())."""
  devs = [_Device(s) for s in stats]
  monkeypatch.setattr(jax, "local_devices", lambda: devs[remote:])
  return types.SimpleNamespace(devices=np.array(devs, dtype=object))


def test_total_memory_is_every_devices_or_the_hosts_ram(monkeypatch):
  have, where = devices.total_memory()  # the 8 CPU devices share the RAM
  with open("/proc/meminfo") as f:
    ram_kib = int(f.readline().split()[1])  # MemTotal
  np.testing.assert_allclose(have, ram_kib * 1024, rtol=0.01, atol=0)
  assert where == "this host's RAM"
  monkeypatch.setattr(devices.jax, "local_devices", lambda: [_Device({})])
  assert devices.total_memory() == (None, "")  # a GPU that does not say
  gpu = _Device({"bytes_limit": 80 * 2**30})
  monkeypatch.setattr(devices.jax, "local_devices", lambda: [gpu])
  assert devices.total_memory() == (8 * 80 * 2**30, "8 GPU device(s)")


def test_device_memory_reads_this_processs_first_device(monkeypatch):
  mesh = _mesh_of(
    monkeypatch, {"bytes_limit": 7}, {"bytes_limit": 100}, remote=1
  )
  assert devices.device_memory(mesh) == 100
  assert (
    devices.device_memory(_mesh_of(monkeypatch, {"bytes_limit": 7}, remote=1))
    is None
  )
  assert (
    devices.device_memory(_mesh_of(monkeypatch, RuntimeError("no stats")))
    is None
  )


def test_device_free_memory_is_the_fullest_local_devices_room(monkeypatch):
  limit = 100
  mesh = _mesh_of(
    monkeypatch,
    {"bytes_limit": limit, "bytes_in_use": 90},  # another process's
    {"bytes_limit": limit, "bytes_in_use": 30},
    {"bytes_limit": limit, "bytes_in_use": 60},
    {"bytes_limit": limit},  # nothing in use
    remote=1,
  )
  assert devices.device_free_memory(mesh) == 40
  unknown = _mesh_of(monkeypatch, {"bytes_limit": limit}, {"bytes_in_use": 1})
  assert devices.device_free_memory(unknown) is None
  raising = _mesh_of(monkeypatch, {"bytes_limit": limit}, RuntimeError("no"))
  assert devices.device_free_memory(raising) is None
  assert devices.device_free_memory(_mesh_of(monkeypatch, {}, remote=1)) is None


def test_options_jit_compiles_with_the_innermost_compile_options():
  """devices.options_jit: the default compile outside compile_options, the
  context's options within (an option XLA:CPU does not know fails that
  compile by name), the outer ones again after an inner context, each
  set of options jitted once (jit_with_options is cached)."""

  @devices.options_jit(static_argnames=("k",))
  def f(x, k):
    return x * k

  x = jnp.arange(3.0)
  bad, known = {"not_an_xla_option": 1}, {"xla_cpu_enable_fast_math": False}
  np.testing.assert_array_equal(f(x, k=2), [0.0, 2.0, 4.0])
  with devices.compile_options(known):
    np.testing.assert_array_equal(f(x, k=2), [0.0, 2.0, 4.0])
    with devices.compile_options(bad):
      with pytest.raises(jax.errors.JaxRuntimeError, match="not_an_xla_option"):
        f(x, k=3)
    np.testing.assert_array_equal(f(x, k=3), [0.0, 3.0, 6.0])
  with devices.compile_options(None):
    np.testing.assert_array_equal(f(x, k=3), [0.0, 3.0, 6.0])
  body = f.__wrapped__
  one = devices.jit_with_options(body, known, static_argnames=("k",))
  assert one is devices.jit_with_options(
    body, dict(known), static_argnames=("k",)
  )


@pytest.mark.parametrize(
  "env, devs, plugin, expected",
  [
    ({}, [], None, [("jax_platforms", "cpu")]),  # libtpu, no TPU: CPU only
    ({"JAX_PLATFORMS": "cuda"}, [], None, []),  # the user's choice wins
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-16"}, [], None, []),  # planning
    ({}, ["/dev/accel0"], None, []),  # a TPU VM
    ({}, [], "jax_cuda12_plugin", []),  # a GPU host
  ],
)
def test_no_tpu_probe_without_tpus(monkeypatch, env, devs, plugin, expected):
  for key in ("JAX_PLATFORMS", "TPU_ACCELERATOR_TYPE"):
    monkeypatch.delenv(key, raising=False)
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  installed = {"libtpu", plugin}
  monkeypatch.setattr(
    devices.importlib.util,
    "find_spec",
    lambda name: object() if name in installed else None,
  )
  monkeypatch.setattr(
    devices.glob, "glob", lambda p: devs if p.startswith("/dev/accel") else []
  )
  calls = []
  monkeypatch.setattr(jax.config, "update", lambda *a: calls.append(a))
  devices.no_tpu_probe_without_tpus()
  assert calls == expected


def test_every_command_line_skips_the_tpu_probe():
  """Each CLI in experiments/ calls it first (through flags.run_main or
  directly), or sets the planner's TPU environment (plan.py, and
  bench/measured_vs_planned.py, which imports it)."""
  root = pathlib.Path(__file__).parents[1] / "experiments"
  missing = [
    str(p.relative_to(root))
    for p in sorted(root.rglob("*.py"))
    if '__name__ == "__main__"' in (text := p.read_text())
    and "run_main(" not in text
    and "no_tpu_probe_without_tpus()" not in text
    and p.name not in ("plan.py", "measured_vs_planned.py")
  ]
  assert not missing, missing
