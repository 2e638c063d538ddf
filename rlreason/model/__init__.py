"""Layer 1, model: the decoder, presets, HF checkpoint IO, tokenizers and the
policy's scores (logits, log-probs, entropy).

Imports only the bottom modules (mesh, types, config, storage, metrics).
"""
