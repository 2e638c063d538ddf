"""Named model configurations: "tiny" for tests and CPU, and real checkpoints.

Real presets mirror the `config.json` of the Hugging Face checkpoint they are
named after; `hf.load` reads the architecture from the checkpoint directory
itself, so a preset is only needed to build shapes without weights (shape
checks, benchmarks, memory estimates) or to initialise at random.
"""

import dataclasses
import os

from rlreason.model.transformer import ModelConfig

_LLAMA3_ROPE_8B = (8.0, 1.0, 4.0, 8192)  # Llama-3.1 rope_scaling
_LLAMA3_ROPE_3_2 = (32.0, 1.0, 4.0, 8192)  # Llama-3.2 rope_scaling

PRESETS: dict[str, ModelConfig] = {
  # ~0.4M parameters: a model that learns the procedural tasks on a laptop
  # CPU in minutes. Vocab 128 covers the built-in character tokenizer.
  "tiny": ModelConfig(
    vocab_size=128,
    d_model=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    mlp_dim=384,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    tie_embeddings=True,
    max_position=512,
    family="llama",
  ),
  # ~1.6M parameters with the character vocabulary, Qwen2 architecture: the
  # laptop base model's shape (experiments/pretrain.py sets the vocab to its
  # tokenizer's). Sized by measurement on a 2-core CPU: at equal wall time
  # a 192-wide model beat a 256-wide one (more tokens seen; 6.0k vs 4.4k
  # training tokens/s at 32 x 160).
  "small": ModelConfig(
    vocab_size=128,
    d_model=192,
    n_layers=4,
    n_heads=6,
    n_kv_heads=3,
    head_dim=32,
    mlp_dim=480,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position=512,
    family="qwen2",
  ),
  # Qwen/Qwen2.5-Math-1.5B (config.json)
  "qwen2.5-math-1.5b": ModelConfig(
    vocab_size=151_936,
    d_model=1536,
    n_layers=28,
    n_heads=12,
    n_kv_heads=2,
    head_dim=128,
    mlp_dim=8960,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position=4096,
    dtype="bfloat16",
    family="qwen2",
  ),
  # Qwen/Qwen2.5-Math-7B
  "qwen2.5-math-7b": ModelConfig(
    vocab_size=152_064,
    d_model=3584,
    n_layers=28,
    n_heads=28,
    n_kv_heads=4,
    head_dim=128,
    mlp_dim=18_944,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=False,
    max_position=4096,
    dtype="bfloat16",
    family="qwen2",
  ),
  # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (from Qwen2.5-Math-1.5B,
  # untied head, 128k positions).
  "deepseek-r1-distill-qwen-1.5b": ModelConfig(
    vocab_size=151_936,
    d_model=1536,
    n_layers=28,
    n_heads=12,
    n_kv_heads=2,
    head_dim=128,
    mlp_dim=8960,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=False,
    max_position=131_072,
    dtype="bfloat16",
    family="qwen2",
  ),
  # deepseek-ai/DeepSeek-R1-Distill-Qwen-7B
  "deepseek-r1-distill-qwen-7b": ModelConfig(
    vocab_size=152_064,
    d_model=3584,
    n_layers=28,
    n_heads=28,
    n_kv_heads=4,
    head_dim=128,
    mlp_dim=18_944,
    rope_theta=10_000.0,
    rms_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=False,
    max_position=131_072,
    dtype="bfloat16",
    family="qwen2",
  ),
  # Qwen/Qwen3-1.7B
  "qwen3-1.7b": ModelConfig(
    vocab_size=151_936,
    d_model=2048,
    n_layers=28,
    n_heads=16,
    n_kv_heads=8,
    head_dim=128,
    mlp_dim=6144,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    qk_norm=True,
    tie_embeddings=True,
    max_position=40_960,
    dtype="bfloat16",
    family="qwen3",
  ),
  # Qwen/Qwen3-4B
  "qwen3-4b": ModelConfig(
    vocab_size=151_936,
    d_model=2560,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    mlp_dim=9728,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    qk_norm=True,
    tie_embeddings=True,
    max_position=40_960,
    dtype="bfloat16",
    family="qwen3",
  ),
  # Qwen/Qwen3-8B
  "qwen3-8b": ModelConfig(
    vocab_size=151_936,
    d_model=4096,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    mlp_dim=12_288,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    qk_norm=True,
    tie_embeddings=False,
    max_position=40_960,
    dtype="bfloat16",
    family="qwen3",
  ),
  # meta-llama/Llama-3.2-1B
  "llama-3.2-1b": ModelConfig(
    vocab_size=128_256,
    d_model=2048,
    n_layers=16,
    n_heads=32,
    n_kv_heads=8,
    head_dim=64,
    mlp_dim=8192,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_ROPE_3_2,
    rms_eps=1e-5,
    tie_embeddings=True,
    max_position=131_072,
    dtype="bfloat16",
    family="llama",
  ),
  # meta-llama/Llama-3.2-3B
  "llama-3.2-3b": ModelConfig(
    vocab_size=128_256,
    d_model=3072,
    n_layers=28,
    n_heads=24,
    n_kv_heads=8,
    head_dim=128,
    mlp_dim=8192,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_ROPE_3_2,
    rms_eps=1e-5,
    tie_embeddings=True,
    max_position=131_072,
    dtype="bfloat16",
    family="llama",
  ),
  # meta-llama/Llama-3.1-8B
  "llama-3.1-8b": ModelConfig(
    vocab_size=128_256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    mlp_dim=14_336,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_ROPE_8B,
    rms_eps=1e-5,
    tie_embeddings=False,
    max_position=131_072,
    dtype="bfloat16",
    family="llama",
  ),
}

# Architectures of further checkpoints the papers train, for shapes only
# (planning, random init): each is an existing preset with its config.json's
# differences.
PRESETS.update(
  {
    # Qwen/Qwen2.5-7B: Qwen2.5-Math-7B's shapes, 128k positions.
    "qwen2.5-7b": dataclasses.replace(
      PRESETS["qwen2.5-math-7b"], rope_theta=1e6, max_position=131_072
    ),
    # Qwen/Qwen2.5-1.5B
    "qwen2.5-1.5b": dataclasses.replace(
      PRESETS["qwen2.5-math-1.5b"], rope_theta=1e6, max_position=131_072
    ),
    # Qwen/Qwen2.5-3B
    "qwen2.5-3b": dataclasses.replace(
      PRESETS["qwen2.5-math-1.5b"],
      d_model=2048,
      n_layers=36,
      n_heads=16,
      mlp_dim=11_008,
      rope_theta=1e6,
      max_position=32_768,
    ),
    # Qwen/Qwen2.5-32B
    "qwen2.5-32b": dataclasses.replace(
      PRESETS["qwen2.5-math-7b"],
      d_model=5120,
      n_layers=64,
      n_heads=40,
      n_kv_heads=8,
      mlp_dim=27_648,
      rope_theta=1e6,
      max_position=131_072,
    ),
    # Qwen/Qwen3-14B(-Base)
    "qwen3-14b": dataclasses.replace(
      PRESETS["qwen3-8b"], d_model=5120, n_layers=40, n_heads=40, mlp_dim=17_408
    ),
    # meta-llama/Llama-2-7b-hf
    "llama-2-7b": dataclasses.replace(
      PRESETS["llama-3.1-8b"],
      vocab_size=32_000,
      n_kv_heads=32,
      mlp_dim=11_008,
      rope_theta=10_000.0,
      rope_scaling=None,
      max_position=4096,
    ),
  }
)

# Checkpoint names (a directory's basename, lower case) whose architecture
# is a preset's: fine-tunes keep their base's shapes.
ARCHITECTURE_OF = {
  "qwen2.5-7b-instruct": "qwen2.5-7b",
  "qwen2.5-7b-instruct-1m": "qwen2.5-7b",
  "qwen2.5-1.5b-instruct": "qwen2.5-1.5b",
  "openmath-nemotron-1.5b": "qwen2.5-1.5b",
  "qwen3-14b-base": "qwen3-14b",
  "laptop-base": "small",  # the shipped base (SHIPPED below)
}


# Checkpoints shipped inside the package, by name: `--model=laptop-base` is
# the laptop base model (experiments/pretrain.py; its base card is the
# directory's README.md), an ordinary HF directory loaded through hf.load.
SHIPPED = {
  "laptop-base": os.path.join(os.path.dirname(__file__), "laptop_base"),
}


def checkpoint_dir(model: str) -> str:
  """The directory a shipped checkpoint's name stands for; any other
  `--model` (a preset or a path) unchanged."""
  return SHIPPED.get(model, model)


def architecture(model: str) -> str | None:
  """The preset whose shapes `model` (a preset name or a checkpoint path
  such as /ckpt/Qwen2.5-32B) has, or None."""
  name = model.rstrip("/").rsplit("/", 1)[-1].lower()
  name = ARCHITECTURE_OF.get(name, name)
  return name if name in PRESETS else None


def get(name: str, **overrides) -> ModelConfig:
  """The preset called `name`, with dataclass fields overridden."""
  try:
    cfg = PRESETS[name.lower()]
  except KeyError:
    raise ValueError(
      f"Unknown model preset {name!r}; known presets: "
      f"{', '.join(sorted(PRESETS))}, or a local HF checkpoint "
      "directory."
    ) from None
  return dataclasses.replace(cfg, **overrides)
