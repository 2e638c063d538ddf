"""Layer 9, eval (top): trained policies loaded from workdirs, HF directories
or presets; evaluation of a checkpoint; a base model's card (pass@k, maj@k,
lengths, entropy, hint use); teachers built from trained policies.

Imports every layer below it.
"""
