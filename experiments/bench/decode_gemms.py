r"""A decode step's products alone: device time per product vs its bound.

  python -m experiments.bench.decode_gemms                  # a GPU: 1.5B
  XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true \
      python -m experiments.bench.decode_gemms              # XLA's search
  python -m experiments.bench.decode_gemms --gemm_model=tiny \
      --gemm_rows=8                                         # CPU smoke run

One decode step multiplies --gemm_rows activations (one per sequence, bf16) by
every weight matrix of each layer, then by the unembedding. At a few
hundred rows these products sit near the ridge of a GPU's roofline, so
each is timed against both bounds: its weights read at the published HBM
bandwidth and its FLOPs at the published bf16 peak (plan/chips.py). The
gate and up products are timed both as the model writes them (two dots,
silu(a) * b) and over one stacked [D, 2, F] weight (the sampler's layout,
ModelConfig.stack_gate_up), and q, k, v as three products and as one.
Times are the device's kernel time from a profiler trace of --gemm_repeats
calls (on CPU: the host's XLA threads), so Python's dispatch does not
count. Flags for XLA's GEMM autotuning go in XLA_FLAGS, one process each
(experiments/bench/gpu_check.sh runs the defaults).
"""

import json

from absl import app
from absl import flags

import jax
import jax.numpy as jnp

from experiments.bench import measure
from rlreason import devices
from rlreason.model import presets
from rlreason.model import transformer
from rlreason.plan import chips

flags.DEFINE_string("gemm_model", "qwen2.5-1.5b", "model/presets.py name")
flags.DEFINE_integer("gemm_rows", 256, "rows per product (sequences decoded)")
flags.DEFINE_integer("gemm_repeats", 20, "calls per product in the trace")
flags.DEFINE_string("gemm_out", "", "write the rows here as JSON")
FLAGS = flags.FLAGS


def products(cfg, rows: int) -> dict:
  """name -> (fn, args, weight bytes, flops): one layer's products in the
  model's form, the stacked forms, and the unembedding."""
  d, f, v = cfg.d_model, cfg.mlp_dim, cfg.vocab_size
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  keys = iter(jax.random.split(jax.random.key(0), 16))

  def normal(*shape):
    return (0.02 * jax.random.normal(next(keys), shape)).astype(jnp.bfloat16)

  x, h = normal(rows, d), normal(rows, f)
  w_gate, w_up = normal(d, f), normal(d, f)
  w_gate_up = jnp.stack([w_gate, w_up], axis=1)  # blocks.stack_gate_up

  def gate_up(x, g, u):  # blocks.Mlp's form
    return jax.nn.silu(x @ g) * (x @ u)

  def gate_up_stacked(x, gu):  # blocks.Mlp's form in the sampler's layout
    y = jnp.einsum("nd,dtf->ntf", x, gu)
    return jax.nn.silu(y[:, 0]) * y[:, 1]

  def qkv(x, wq, wk, wv):  # blocks.Attention's form (heads flattened)
    return x @ wq, x @ wk, x @ wv

  table = {
    "q,k,v": (
      qkv,
      (x, normal(d, q), normal(d, kv), normal(d, kv)),
      d * (q + 2 * kv),
    ),
    "q|k|v stacked": (
      lambda x, w: x @ w,
      (x, normal(d, q + 2 * kv)),
      d * (q + 2 * kv),
    ),
    "q": (lambda x, w: x @ w, (x, normal(d, q)), d * q),
    "k+v": (lambda x, w: x @ w, (x, normal(d, 2 * kv)), d * 2 * kv),
    "o": (lambda x, w: x @ w, (normal(rows, q), normal(q, d)), q * d),
    "gate,up": (gate_up, (x, w_gate, w_up), 2 * d * f),
    "gate|up stacked": (gate_up_stacked, (x, w_gate_up), 2 * d * f),
    "down": (lambda h, w: h @ w, (h, normal(f, d)), f * d),
    "unembed (fp32 out)": (transformer.logits_dot, (x, normal(d, v)), d * v),
  }
  return {
    name: (jax.jit(fn), args, 2 * n, 2 * rows * n)
    for name, (fn, args, n) in table.items()
  }


def kernel_seconds(fn, args, repeats: int) -> float:
  """Device seconds per call: the busiest trace line's kernel time (the
  compute stream; not the module-span lines) over `repeats` calls."""
  jax.block_until_ready(fn(*args))  # compile outside the trace
  rows = measure.kernel_times(
    lambda: [fn(*args) for _ in range(repeats)], top=10_000
  )
  per_line = {
    line: secs
    for line, name, _, secs in rows
    if name == "(all)" and "Module" not in line and "Step" not in line
  }
  return max(per_line.values()) / repeats


def main(argv):
  del argv
  cfg = presets.get(FLAGS.gemm_model)
  device = jax.devices()[0]
  peak, bw = chips.local_peaks(device) or (None, None)
  print(f"{device.device_kind}: {FLAGS.gemm_rows} rows of {FLAGS.gemm_model}")
  print(
    f"{'product':20s} {'us':>8s} {'MB':>7s} {'TB/s':>6s} {'% bw':>6s} "
    f"{'% flops':>7s} {'% bound':>7s}"
  )
  out = []
  for name, (fn, args, nbytes, flops) in products(cfg, FLAGS.gemm_rows).items():
    s = kernel_seconds(fn, args, FLAGS.gemm_repeats)
    row = {
      "product": name,
      "us": s * 1e6,
      "weight_bytes": nbytes,
      "flops": flops,
    }
    line = f"{name:20s} {s * 1e6:8.1f} {nbytes / 1e6:7.1f} "
    line += f"{nbytes / s / 1e12:6.2f}"
    if bw:  # the weights at the published bandwidth, the FLOPs at peak
      bound = max(nbytes / bw, flops / peak)
      row.update(
        bw_frac=nbytes / bw / s,
        flops_frac=flops / peak / s,
        bound_frac=bound / s,
      )
      line += f" {row['bw_frac']:6.1%} {row['flops_frac']:7.1%}"
      line += f" {row['bound_frac']:7.1%}"
    print(line, flush=True)
    out.append(row)
  if FLAGS.gemm_out:
    with open(FLAGS.gemm_out, "w") as fh:
      json.dump({"device": device.device_kind, "rows": out}, fh, indent=1)


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  app.run(main)
