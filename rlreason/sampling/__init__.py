"""Layer 2, sampling: jitted KV-cache sampling (sampler, token filters, stops,
vocab scans), rollouts (repeat G, pad, reshard, detokenize), segments and
tree rollouts, and scoring of sampled completions (pass@k, maj@k).

Imports model/ and the bottom modules.
"""
