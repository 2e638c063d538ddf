"""Decoder model, presets, HF checkpoint IO and tokenizers."""
