"""rlreason: JAX-native RL for language-model reasoning."""

__version__ = "0.1.0"
