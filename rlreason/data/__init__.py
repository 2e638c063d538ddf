"""Layer 4, data: prompt sources (jsonl / parquet / HF / tfds / task specs),
the resumable prompt iterator, the procedural tasks, answer extraction,
curricula, difficulty tracking and rollout allocation.

Imports rl/, sampling/, model/ and the bottom modules.
"""
