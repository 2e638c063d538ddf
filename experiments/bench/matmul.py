r"""Decode-shaped matmuls: XLA:CPU vs torch, the ceiling of the sampler.

  python -m experiments.bench.matmul

A decode step multiplies a few rows (one per sequence) by every weight
matrix, so the sampler benchmark's medium shape (16 sequences, 124.7M
params) is bound by how fast [16, 768] x [768, 2048]-like products run. This
prints GFLOP/s for those shapes under XLA (what rlreason's jitted sampler
uses) and torch (what HF generate uses), both on 2 threads, and the
time a medium decode step would spend in matmuls alone at that speed.
"""

import jax
import jax.numpy as jnp
from absl import app

from experiments.bench import measure
from rlreason import devices

# Weights of the medium shape's decode step: 12 layers x (q, k, v, o, gate,
# up, down) + the lm head, as (in, out) matrices.
_MEDIUM = (
  [(768, 768), (768, 256), (768, 256), (768, 768)] * 12
  + [
    (768, 2048),
    (768, 2048),
    (2048, 768),
  ]
  * 12
  + [(768, 32_000)]
)


def _xla(rows: int, dtype) -> float:
  ws = [jnp.full(s, 1e-3, dtype) for s in _MEDIUM]
  x = jnp.ones((rows, 768), dtype)
  xs = {768: x, 2048: jnp.ones((rows, 2048), dtype)}

  @jax.jit
  def step(xs, ws):
    return sum(
      jnp.dot(xs[w.shape[0]], w, preferred_element_type=jnp.float32).sum()
      for w in ws
    )

  return measure.timed(lambda: step(xs, ws), 7)[0]


def _torch(rows: int, dtype: str) -> float:
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(2)
  dt = getattr(torch, dtype)
  ws = [torch.full(s, 1e-3, dtype=dt) for s in _MEDIUM]
  xs = {d: torch.ones(rows, d, dtype=dt) for d in (768, 2048)}

  def step():
    with torch.no_grad():
      return sum(float((xs[w.shape[0]] @ w).sum()) for w in ws)

  return measure.timed(step, 7)[0]


def main(argv):
  del argv
  flops_per_row = 2 * sum(a * b for a, b in _MEDIUM)
  print(
    f"jax {jax.__version__}; medium decode step: "
    f"{sum(a * b for a, b in _MEDIUM) / 1e6:.1f}M weights"
  )
  for dtype in ("float32", "bfloat16"):
    for rows in (16, 64):
      flops = flops_per_row * rows
      t_xla = _xla(rows, getattr(jnp, dtype))
      t_torch = _torch(rows, dtype)
      print(
        f"{dtype:8s} {rows:3d} rows: XLA {flops / t_xla / 1e9:6.1f} GFLOP/s "
        f"({t_xla * 1e3:6.1f} ms/step) | torch "
        f"{flops / t_torch / 1e9:6.1f} GFLOP/s ({t_torch * 1e3:6.1f} ms/step)"
        f" | {rows / t_xla:6.0f} vs {rows / t_torch:6.0f} tok/s ceiling",
        flush=True,
      )


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  app.run(main)
