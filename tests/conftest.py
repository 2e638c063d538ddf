"""Test setup shared by every test module.

8 simulated CPU devices must be requested before JAX initialises its backend,
so this runs at collection time, before any test module imports jax.
"""

import os

# XLA:CPU's elemental emitters in place of its MLIR fusion emitters: the
# same programs compile in ~40% less time (session 66, cold compile cache:
# continuous, attention and entropy_reg tests 175 -> 106 s; an rloo smoke
# run's compiles 10.3 -> 6.3 s). Subprocesses keep it (testing.xla_flags).
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_cpu_use_fusion_emitters=false"
  + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compile far more than they run: without XLA's optimisation passes
# (LLVM's among them) the compile-bound files take 20-40% less time
# (session 53: continuous_test 92 -> 56 s, five experiment smoke runs
# 129 -> 105 s, pretrain + notebooks 169 -> 126 s). The values are the same
# to rounding, not bit for bit; every comparison in the suite has its
# tolerance or compares two runs under the same setting. Subprocesses
# inherit it; the planner's TPU compiles (tests/plan/plan_test.py) drop it.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Tests never reach a hub: everything they load they wrote themselves.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# Compiled programs are shared between test processes (pytest-xdist workers,
# subprocesses): the experiment smoke tests compile the same sampler, warm
# start and evaluation programs many times over, and a killed run's rerun
# those of the run before it. Every program is kept, not only those that
# took a second to compile (JAX's default): as environment variables, so
# the subprocesses keep theirs too (tracker_resume_test's three runs:
# 44 -> 37 s).
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(os.path.dirname(os.path.dirname(__file__)), ".jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_disable_most_optimizations", True)  # as set above
jax.config.update("jax_default_matmul_precision", "highest")
# As set above (in case a plugin imported jax before this file ran).
jax.config.update(
  "jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"]
)
jax.config.update(
  "jax_persistent_cache_min_compile_time_secs",
  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)
jax.config.update(
  "jax_persistent_cache_min_entry_size_bytes",
  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
)


@pytest.fixture(autouse=True)
def _no_signal_handlers_left(request):
  """Every test leaves the signal handlers as it found them: a run's
  preemption.Preemption (SIGTERM / Ctrl-C) goes however the run ends. One
  left behind would turn the next test's run into a stopped one."""
  yield
  from rlreason.train import preemption

  alive = preemption._SIGNALLED["alive"]
  preemption._SIGNALLED.update(alive=0, requested=False)  # the next is clean
  assert alive == 0, f"{request.node.nodeid} left {alive} Preemption(s)"


def _map_count() -> int:
  """This process's memory mappings (0 where /proc has none)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return 0


def _map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530  # Linux's default


# A third of the kernel's limit on one process's memory mappings.
_MAPS_CLEARED_AT = _map_limit() // 3


@pytest.fixture(autouse=True)
def _compiled_programs_within_the_mapping_limit():
  """Every compiled XLA:CPU program holds memory mappings (~65 per test on
  average: 204 tests of tests/rl and train_step_test.py left 13,196) until
  jax.clear_caches() drops it. XLA:CPU segfaulted in a worker's compile or
  cache write late in the suite (84-96%: sessions 82, 94, 95) while the
  surviving worker held 37,452: the crashed one, we infer (its count was
  not read), had crossed vm.max_map_count (65,530). Past a third of the
  limit the caches are dropped (the persistent compilation cache keeps the
  programs); no crash since in the runs of session 95."""
  yield
  if _map_count() > _MAPS_CLEARED_AT:
    import gc

    jax.clear_caches()
    gc.collect()
