"""Layer 1, model: the decoder (transformer) and its attention, presets, HF
checkpoint IO (hf; hf_layout maps the weights), tokenizers and the policy's
scores (logits, log-probs, entropy).

Imports only the bottom modules (mesh, types, config, storage, metrics).
"""
