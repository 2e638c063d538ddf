r"""LoRA rollouts: merge base + adapters once per rollout, or sample unmerged.

  python -m experiments.bench.lora
  python -m experiments.bench.lora --quantize=nf4

The small shape of experiments/bench/sampling.py (random weights, fp32),
LoRA rank --rank on every linear map. Times, in one run:
  merged    lora.merge once (timed separately) + the sampler on plain params;
  unmerged  the sampler on lora.combine's tree: every decode step forms
            each adapted (and dequantised) weight as it uses it.
Prints generated tokens/s of both (the merged figure includes its merge),
their ratio and the merge time. Best of --repeats interleaved calls,
compile excluded. The loop merges once per step (train/adapters.py).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from experiments.bench.rollout_lengths import small_model
from experiments.bench.sampling import SHAPES
from rlreason import devices
from rlreason.model import lora
from rlreason.sampling import draw
from rlreason.sampling import sampler

_RANK = flags.DEFINE_integer("rank", 16, "LoRA rank.")
_QUANTIZE = flags.DEFINE_enum("quantize", "", list(lora.QUANTIZE), "")


def bench(rank: int, quantize: str, repeats: int) -> dict:
  shape = SHAPES["small"]
  model_cfg, params = small_model()
  lcfg = lora.LoraConfig(rank=rank, quantize=quantize)
  base = lora.quantize(params, lcfg)
  adapters = jax.tree.map(
    lambda x: x + 1e-3, lora.init(params, lcfg, jax.random.key(1))
  )
  prompts = jnp.asarray(
    np.random.default_rng(1).integers(
      3, shape.vocab_size, (shape.n, shape.prompt_len)
    ),
    jnp.int32,
  )
  positions = jnp.broadcast_to(jnp.arange(shape.prompt_len), prompts.shape)
  merge = jax.jit(lambda b, a: lora.merge(b, a, lcfg))

  def sample(p):
    out = sampler.sample(
      p,
      prompts,
      positions,
      jax.random.key(0),
      model_cfg=model_cfg,
      max_new_tokens=shape.new_tokens,
      sampling=draw.Sampling(temperature=1.0),
    )
    return jax.block_until_ready(out)

  combined = lora.combine(base, adapters, lcfg)
  sample(merge(base, adapters))  # compile both
  sample(combined)
  merge_s = merged_s = unmerged_s = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    merged = jax.block_until_ready(merge(base, adapters))
    t1 = time.perf_counter()
    sample(merged)
    t2 = time.perf_counter()
    sample(combined)
    t3 = time.perf_counter()
    merge_s = min(merge_s, t1 - t0)
    merged_s = min(merged_s, t2 - t0)
    unmerged_s = min(unmerged_s, t3 - t2)
  generated = shape.n * shape.new_tokens
  print(
    f"rank {rank}, base {quantize or model_cfg.dtype}: merged "
    f"{generated / merged_s:7.0f} tok/s ({merged_s:.2f} s, of which merge "
    f"{merge_s * 1e3:.1f} ms) | unmerged {generated / unmerged_s:7.0f} tok/s "
    f"({unmerged_s:.2f} s) | merged / unmerged {unmerged_s / merged_s:.2f}x",
    flush=True,
  )
  return dict(merged_s=merged_s, unmerged_s=unmerged_s, merge_s=merge_s)


def main(argv):
  del argv
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
  bench(_RANK.value, _QUANTIZE.value, flags.FLAGS.repeats)


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  app.run(main)
