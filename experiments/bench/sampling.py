r"""Sampler throughput: rlreason vs Hugging Face `generate`, same weights.

  python -m experiments.bench.sampling --shape=both
  python -m experiments.bench.sampling --shape=small --dtype=bfloat16

Builds a random transformers `Qwen2ForCausalLM`, saves it to a temporary
directory and loads it with `rlreason.model.hf.load`, so both samplers run
the same weights. Both sample at temperature 1 with no top-k / top-p and a
KV cache, with EOS disabled so every row generates exactly T tokens. HF runs
torch on CPU with 2 threads. Compile time (our first call) is reported
separately (JAX's trace + lower + compile events) and excluded from
throughput; each sampler gets one warm-up call,
then --repeats timed calls of each, interleaved, and the best is reported
(the machine is shared and its load drifts).

Shapes (N sequences, P prompt tokens, T new tokens):
  small   4 layers, d_model 256, 8 heads, 2 kv heads, mlp 1024, vocab 8192,
          tied embeddings; N=64, P=32, T=128.
  medium  12 layers, d_model 768, 12 heads, 4 kv heads, mlp 2048,
          vocab 32000, untied; N=16, P=128, T=256.
"""

import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from rlreason import devices
from rlreason.sampling import sampler as sampling
from rlreason.sampling import draw
from rlreason.model import hf


@dataclasses.dataclass(frozen=True)
class Shape:
  n_layers: int
  d_model: int
  n_heads: int
  n_kv_heads: int
  mlp_dim: int
  vocab_size: int
  tie: bool
  n: int  # sequences
  prompt_len: int
  new_tokens: int


SHAPES = {
  "small": Shape(4, 256, 8, 2, 1024, 8192, True, 64, 32, 128),
  "medium": Shape(12, 768, 12, 4, 2048, 32_000, False, 16, 128, 256),
}

_SHAPE = flags.DEFINE_enum(
  "shape",
  "both",
  ["small", "medium", "both"],
  "Which benchmark shape(s) to run.",
)
_DTYPE = flags.DEFINE_enum(
  "dtype",
  "float32",
  ["float32", "bfloat16"],
  "Parameter and compute dtype, for both samplers.",
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per sampler.")
_SKIP_HF = flags.DEFINE_bool("skip_hf", False, "Only time rlreason.")
_HF_THREADS = flags.DEFINE_integer(
  "hf_threads",
  2,
  "torch.set_num_threads for HF. On a loaded machine "
  "OpenMP's spinning threads slow torch down far more than XLA.",
)


def _write_checkpoint(shape: Shape, path: str, dtype: str):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
    vocab_size=shape.vocab_size,
    hidden_size=shape.d_model,
    intermediate_size=shape.mlp_dim,
    num_hidden_layers=shape.n_layers,
    num_attention_heads=shape.n_heads,
    num_key_value_heads=shape.n_kv_heads,
    max_position_embeddings=2048,
    tie_word_embeddings=shape.tie,
    rope_theta=10_000.0,
    use_sliding_window=False,
  )
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  model.save_pretrained(path, safe_serialization=True)
  return model.to(getattr(torch, dtype))


_COMPILE_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "/jax/core/compile/backend_compile_duration",
)
_compile_s = [0.0]


def _on_event(name: str, secs: float, **kwargs):
  del kwargs
  if name in _COMPILE_EVENTS:
    _compile_s[0] += secs


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _rlreason_sampler(path: str, shape: Shape, prompts: np.ndarray, dtype: str):
  """A function that samples N x T tokens with rlreason."""
  model_cfg, params = hf.load(path, dtype=dtype)
  tokens = jax.device_put(jnp.asarray(prompts, jnp.int32))
  positions = jax.device_put(
    jnp.broadcast_to(
      jnp.arange(shape.prompt_len, dtype=jnp.int32), prompts.shape
    )
  )
  rng = jax.random.key(0)

  def run():
    out = sampling.sample(
      params,
      tokens,
      positions,
      rng,
      model_cfg=model_cfg,
      max_new_tokens=shape.new_tokens,
      sampling=draw.Sampling(temperature=1.0),
      stop_ids=(),
    )  # EOS disabled: exactly T tokens.
    jax.block_until_ready(out)
    assert out.tokens.shape == (shape.n, shape.new_tokens)

  return run


def _hf_sampler(model, shape: Shape, prompts: np.ndarray, threads: int):
  """A function that samples N x T tokens with HF generate."""
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(threads)
  input_ids = torch.tensor(prompts)
  attention_mask = torch.ones_like(input_ids)

  def run():
    with torch.no_grad():
      out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        use_cache=True,
        max_new_tokens=shape.new_tokens,
        min_new_tokens=shape.new_tokens,
        eos_token_id=None,
        pad_token_id=0,
      )
    assert out.shape == (shape.n, shape.prompt_len + shape.new_tokens)

  return run


def bench(
  name: str, dtype: str, repeats: int, skip_hf: bool, hf_threads: int = 2
) -> dict:
  """Times both samplers on one shape; returns tokens/s and the ratio."""
  shape = SHAPES[name]
  prompts = np.random.default_rng(0).integers(
    3, shape.vocab_size, (shape.n, shape.prompt_len)
  )
  generated = shape.n * shape.new_tokens
  with tempfile.TemporaryDirectory() as path:
    model = _write_checkpoint(shape, path, dtype)
    ours = _rlreason_sampler(path, shape, prompts, dtype)
  compiled_before = _compile_s[0]
  _time(ours)  # compile + one run
  compile_s = _compile_s[0] - compiled_before  # trace + lower + compile
  theirs = None if skip_hf else _hf_sampler(model, shape, prompts, hf_threads)
  if theirs:
    theirs()  # warm-up
  # Interleaved, best of `repeats`: the machine's load drifts.
  ours_times, hf_times = [], []
  for _ in range(repeats):
    ours_times.append(_time(ours))
    if theirs:
      hf_times.append(_time(theirs))
  ours_s = min(ours_times)
  result = {
    "shape": name,
    "dtype": dtype,
    "tokens": generated,
    "rlreason_tok_s": generated / ours_s,
    "compile_s": compile_s,
  }
  line = (
    f"{name:6s} {dtype}: rlreason {generated / ours_s:7.0f} tok/s "
    f"({ours_s:.2f} s, compile {result['compile_s']:.1f} s)"
  )
  if theirs:
    hf_s = min(hf_times)
    result.update(hf_tok_s=generated / hf_s, ratio=hf_s / ours_s)
    line += (
      f" | HF generate ({hf_threads} threads) "
      f"{generated / hf_s:7.0f} tok/s ({hf_s:.2f} s)"
      f" | ratio {hf_s / ours_s:.2f}x"
    )
  print(line, flush=True)
  return result


def main(argv):
  del argv
  names = ["small", "medium"] if _SHAPE.value == "both" else [_SHAPE.value]
  print(
    f"jax {jax.__version__} on {jax.devices()[0].platform}; "
    f"{len(jax.devices())} device(s)"
  )
  for name in names:
    bench(name, _DTYPE.value, _REPEATS.value, _SKIP_HF.value, _HF_THREADS.value)


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  app.run(main)
