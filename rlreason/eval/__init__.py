"""Layer 9, eval (top): trained policies loaded from workdirs, HF directories
or presets; evaluation of a checkpoint; teachers built from trained policies.

Imports every layer below it.
"""
