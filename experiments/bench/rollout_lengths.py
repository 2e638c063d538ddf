r"""Static vs continuous batching on long-tailed response lengths.

  python -m experiments.bench.rollout_lengths
  python -m experiments.bench.rollout_lengths --refill=host --refill_every=8

The small shape of experiments/bench/sampling.py (4 layers, d_model 256,
vocab 8192, P=32, T=128; random weights, fp32), with --rows prompts and
--slots rows in flight for both samplers (the rows a device's memory holds):
the static sampler (sampler.sample) runs them in calls of --slots rows,
each until its longest row stops; the continuous one (continuous.sample)
keeps --slots decode slots busy by refilling finished ones.

Each row's length is drawn from a lognormal with the given median and a
90th percentile of --p90_ratio x the median, capped at T, and forced by a
per-row budget (row_limits) with EOS disabled, so both samplers generate
exactly as many tokens (checked: same masks). A second case gives every row
the same length (T, or --equal_length). Prints generated tokens/s of both,
their ratio, and the continuous sampler's slot utilisation (generated
tokens / (decode steps x slots)). Compile time is excluded (one
warm-up call each); best of --repeats interleaved calls.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from experiments.bench.sampling import SHAPES
from rlreason import devices
from rlreason.model import transformer
from rlreason.sampling import continuous
from rlreason.sampling import draw
from rlreason.sampling import sampler

_ROWS = flags.DEFINE_integer("rows", 1024, "Prompts (rows) per call.")
_SLOTS = flags.DEFINE_integer(
  "slots", 64, "Rows in flight: static call size and continuous slots."
)
_MEDIAN = flags.DEFINE_integer("median", 16, "Median response length.")
_P90_RATIO = flags.DEFINE_float("p90_ratio", 4.0, "90th percentile / median.")
_EQUAL_LENGTH = flags.DEFINE_integer(
  "equal_length", 0, "Length of the equal-length case (0: T)."
)
_REFILL = flags.DEFINE_enum("refill", "loop", continuous.REFILL_MODES, "")
_REFILL_EVERY = flags.DEFINE_integer("refill_every", 1, "Decode steps K.")
_REFILL_ROWS = flags.DEFINE_integer(
  "refill_rows", 0, "Prompts per refill prefill (0: slots // 8)."
)
# --repeats comes with bench.sampling (imported for its shapes).


def lengths(rows: int, median: int, p90_ratio: float, cap: int, seed=0):
  """[rows] int32 lognormal lengths: median `median`, 90th percentile
  p90_ratio x median, clipped to [1, cap]."""
  sigma = np.log(p90_ratio) / 1.2815515655446004  # z of the 90th pct.
  x = np.random.default_rng(seed).lognormal(np.log(median), sigma, rows)
  return np.clip(np.round(x), 1, cap).astype(np.int32)


def small_model():
  """(model_cfg, random fp32 params) of bench.sampling's small shape."""
  shape = SHAPES["small"]
  model_cfg = transformer.ModelConfig(
    vocab_size=shape.vocab_size,
    d_model=shape.d_model,
    n_layers=shape.n_layers,
    n_heads=shape.n_heads,
    n_kv_heads=shape.n_kv_heads,
    head_dim=shape.d_model // shape.n_heads,
    mlp_dim=shape.mlp_dim,
    tie_embeddings=shape.tie,
  )
  return model_cfg, transformer.init(model_cfg, jax.random.key(0))


def _samplers(model_cfg, params, prompts, limits, shape, slots, **cont):
  """Functions that sample every row with each sampler."""
  m, p = prompts.shape
  positions = np.broadcast_to(np.arange(p, dtype=np.int32), prompts.shape)
  common = dict(
    model_cfg=model_cfg,
    max_new_tokens=shape.new_tokens,
    sampling=draw.Sampling(temperature=1.0),
    stop_ids=(),  # EOS disabled: the budgets set the lengths
  )
  rng = jax.random.key(0)
  dev = lambda x: jax.device_put(jnp.asarray(x))  # noqa: E731

  def static():
    outs = [
      sampler.sample(
        params,
        dev(prompts[lo : lo + slots]),
        dev(positions[lo : lo + slots]),
        rng,
        row_offset=lo,
        row_limits=dev(limits[lo : lo + slots]),
        **common,
      )
      for lo in range(0, m, slots)
    ]
    return jax.block_until_ready(
      jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
    )

  def cont_():
    out, stats = continuous.sample(
      params,
      dev(prompts),
      dev(positions),
      rng,
      slots=slots,
      row_limits=dev(limits),
      return_stats=True,
      **cont,
      **common,
    )
    return jax.block_until_ready(out), stats

  return static, cont_


def _best(fn, repeats):
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return min(times), out


def bench(name: str, limits: np.ndarray, slots: int, repeats: int, **cont):
  """Times both samplers on rows with the given lengths; returns a dict."""
  shape = SHAPES["small"]
  model_cfg, params = small_model()
  prompts = np.random.default_rng(1).integers(
    3, shape.vocab_size, (len(limits), shape.prompt_len), dtype=np.int32
  )
  static, cont = _samplers(
    model_cfg, params, prompts, limits, shape, slots, **cont
  )
  ref = static()  # warm-up (compile)
  out, stats = cont()
  # Lengths and masks must match exactly; a token may differ where the
  # batched forward's rounding (other batch shapes) flips a near-tie of the
  # random model's nearly uniform distribution, and the row diverges after.
  same_rows = int(
    (np.asarray(ref.tokens) == np.asarray(out.tokens)).all(1).sum()
  )
  if not np.array_equal(ref.mask, out.mask):
    raise AssertionError("static and continuous masks differ")
  static_s = cont_s = float("inf")
  for _ in range(repeats):  # interleaved: the machine's load drifts
    static_s = min(static_s, _best(static, 1)[0])
    cont_s = min(cont_s, _best(cont, 1)[0])
  generated = int(limits.sum())
  result = dict(
    case=name,
    generated=generated,
    static_tok_s=generated / static_s,
    continuous_tok_s=generated / cont_s,
    ratio=static_s / cont_s,
    utilisation=stats.utilisation,
    identical_rows=same_rows,
  )
  print(
    f"{name:12s} {len(limits)} rows, {slots} in flight, lengths median "
    f"{np.median(limits):.0f} p90 {np.percentile(limits, 90):.0f} max "
    f"{limits.max()}: static {result['static_tok_s']:7.0f} tok/s "
    f"({static_s:.2f} s) | continuous {result['continuous_tok_s']:7.0f} "
    f"tok/s ({cont_s:.2f} s, {stats.steps} steps, {stats.prefills} prefills, "
    f"utilisation {stats.utilisation:.0%}) | ratio {result['ratio']:.2f}x | "
    f"rows with identical tokens: {same_rows}/{len(limits)}",
    flush=True,
  )
  return result


def main(argv):
  del argv
  t = SHAPES["small"].new_tokens
  print(
    f"jax {jax.__version__} on {jax.devices()[0].platform}; refill="
    f"{_REFILL.value}, every {_REFILL_EVERY.value} step(s), "
    f"{_REFILL_ROWS.value or max(1, _SLOTS.value // 8)} prompts per prefill"
  )
  cont = dict(
    refill=_REFILL.value,
    refill_every=_REFILL_EVERY.value,
    refill_rows=_REFILL_ROWS.value,
  )
  tail = lengths(_ROWS.value, _MEDIAN.value, _P90_RATIO.value, t)
  bench("long-tailed", tail, _SLOTS.value, flags.FLAGS.repeats, **cont)
  equal = np.full(_ROWS.value, _EQUAL_LENGTH.value or t, np.int32)
  bench("equal", equal, _SLOTS.value, flags.FLAGS.repeats, **cont)


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  app.run(main)
