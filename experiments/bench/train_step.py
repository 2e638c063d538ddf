r"""Train-step throughput and model FLOPs utilisation against matmul peak.

Shape: the sampler benchmark's "medium" model (12 layers, d_model 768, 12
heads, 4 kv heads, mlp 2048, vocab 32000), 16 sequences of 384 tokens, fp32,
forward + backward + AdamW update (rlreason.train.train_step), on whatever
devices JAX sees. The peak is measured in the same run: the best of several
large square fp32 matmuls (jnp.dot) on one device.

  python -m experiments.bench.train_step            # CPU: ~2-4 minutes
  python -m experiments.bench.train_step --seqs=64  # a larger batch

MFU = model FLOPs per step / step time / peak, with model FLOPs =
6 * (non-embedding params + lm head) * tokens + 12 * L * D * S * tokens
(causal attention counted in full, as is usual).
"""

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import measure
from rlreason import devices
from rlreason.rl import aggregation
from rlreason.model import policy
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts
from rlreason.model import transformer

MEDIUM = transformer.ModelConfig(
  vocab_size=32_000,
  d_model=768,
  n_layers=12,
  n_heads=12,
  n_kv_heads=4,
  head_dim=64,
  mlp_dim=2048,
  qkv_bias=True,
  family="qwen2",
)


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
  """Best measured fp32 matmul FLOP/s on one device."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  seconds, _ = measure.timed(jax.jit(lambda x: x @ x), repeats, a)
  return 2 * n**3 / seconds


def model_flops(cfg, seqs, seq_len) -> float:
  tokens = seqs * seq_len
  attn = cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
  per_layer = attn + 3 * cfg.d_model * cfg.mlp_dim
  dense = cfg.n_layers * per_layer + cfg.d_model * cfg.vocab_size
  attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
  return 6 * dense * tokens + attention * tokens


def loss_fn(params, batch, norm, *, model_cfg, prompt_len):
  logp = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], model_cfg, prompt_len
  )
  per_token = -batch["adv"][:, None] * logp
  return aggregation.aggregate(per_token, batch["mask"], **norm), {}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--seqs", type=int, default=16)
  parser.add_argument("--seq_len", type=int, default=384)
  parser.add_argument("--prompt_len", type=int, default=128)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--dtype", default="float32")
  args = parser.parse_args()
  cfg = transformer.ModelConfig(**{**MEDIUM.__dict__, "dtype": args.dtype})
  n, s, p = args.seqs, args.seq_len, args.prompt_len
  rng = np.random.default_rng(0)
  batch = {
    "tokens": jnp.asarray(rng.integers(0, cfg.vocab_size, (n, s)), jnp.int32),
    "positions": jnp.broadcast_to(jnp.arange(s), (n, s)),
    "mask": jnp.ones((n, s - p), jnp.float32),
    "adv": jnp.asarray(rng.normal(size=n), jnp.float32),
  }
  params = transformer.init(cfg, jax.random.key(0))
  opt = optimizer_lib.make_optimizer(1e-5, total_steps=100)
  state = ts.init_state(params, opt)
  step = ts.make_train_step(
    functools.partial(loss_fn, model_cfg=cfg, prompt_len=p), opt
  )
  t = time.perf_counter()
  state, m = step(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(args.steps):
    t = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
  step_s = float(np.median(times))
  peak = matmul_peak()
  flops = model_flops(cfg, n, s)
  print(f"devices: {jax.devices()}")
  print(
    f"model: {cfg.num_params() / 1e6:.1f}M params, {n} x {s} tokens, "
    f"{args.dtype}"
  )
  print(f"first step (compile + run): {compile_s:.1f} s")
  print(
    f"train step: {step_s:.3f} s median of {args.steps} "
    f"({n * s / step_s:,.0f} tokens/s)"
  )
  print(
    f"model FLOPs/step: {flops / 1e9:.1f} GFLOP -> "
    f"{flops / step_s / 1e9:.1f} GFLOP/s"
  )
  print(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s")
  print(f"MFU: {100 * flops / step_s / peak:.1f}% of measured peak")


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  main()
