"""Measuring programs on the local device, for the benchmarks beside it
(measured_vs_planned.py, decode_gemms.py): the best of repeated timed
calls, the allocator's peak, a trace's longest kernels, the device's
measured matmul and copy ceilings, and random parameters laid out as an
abstract tree (no host copy of the whole model)."""

import functools
import time

import jax
import jax.numpy as jnp


def peak_in_use() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def timed(fn, repeats: int, *args) -> tuple[float, object]:
  """(best seconds of `repeats` calls after one warm-up, last output)."""
  out = jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best, out


def kernel_times(fn, top: int) -> list[tuple[str, str, int, float]]:
  """Trace one call of `fn` and return the `top` (line, kernel, calls,
  seconds) of the device planes (the host's XLA threads on CPU), by total
  time per kernel name, and each line's total (kernel "(all)")."""
  import glob  # noqa: PLC0415
  import tempfile  # noqa: PLC0415

  from jax.profiler import ProfileData  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      jax.block_until_ready(fn())
    (path,) = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
    data = ProfileData.from_file(path)
  planes = [p for p in data.planes if p.name.startswith("/device:")]
  if not planes:  # CPU: XLA's thunks run on the host's threads
    planes = [p for p in data.planes if p.name == "/host:CPU"]
  totals = {}
  for plane in planes:
    for line in plane.lines:
      for e in line.events:
        if e.name.startswith("$"):  # Python frames, not kernels
          continue
        key = (line.name, e.name)
        calls, ns = totals.get(key, (0, 0.0))
        totals[key] = (calls + 1, ns + e.duration_ns)
  lines = {}
  for (ln, _), (c, ns) in totals.items():  # each line's whole: "(all)"
    lc, lns = lines.get(ln, (0, 0.0))
    lines[ln] = (lc + c, lns + ns)
  totals.update({(ln, "(all)"): v for ln, v in lines.items()})
  rows = sorted(totals.items(), key=lambda kv: -kv[1][1])[: top + len(lines)]
  return [(ln, name, c, ns / 1e9) for (ln, name), (c, ns) in rows]


def measured_ceilings(n: int) -> dict:
  """This device's best bf16 matmul FLOP/s (n x n x n) and copy bytes/s
  (an n x n x 16 bf16 array read and written), beside the published
  peaks the plan uses."""
  a = jnp.ones((n, n), jnp.bfloat16)
  mm, _ = timed(jax.jit(lambda x: x @ x), 3, a)  # the warm-up compiles
  b = jnp.ones((16 * n, n), jnp.bfloat16)
  cp, _ = timed(jax.jit(lambda x: x + 1), 3, b)
  return {
    "measured_matmul_flops": 2 * n**3 / mm,
    "measured_copy_bandwidth": 2 * b.nbytes / cp,
  }


@functools.lru_cache(maxsize=64)
def _filler(shape, dtype, sharding, ones: bool):
  def make(key):
    if ones:
      return jnp.ones(shape, dtype)
    return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)

  return jax.jit(make, out_shardings=sharding)


def random_params(abstract_params, dtype=None):
  """Random parameters (normal, std 0.02; norm scales 1) laid out as the
  abstract tree, one small program per distinct leaf shape: XLA:GPU took
  over 150 s to compile a 1.5B model's whole init as one program (H200,
  jax 0.11.2)."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(abstract_params)
  out = []
  for i, (path, x) in enumerate(leaves):
    ones = "norm" in jax.tree_util.keystr(path)
    fill = _filler(x.shape, dtype or x.dtype, x.sharding, ones)
    out.append(fill(jax.random.key(i)))
  return jax.tree.unflatten(tree, out)
