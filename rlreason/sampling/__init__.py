"""Layer 2, sampling: jitted KV-cache sampling (sampler: static batches;
continuous: decode slots refilled as rows finish; draw: token filters and
per-row keys; stops, vocab scans), rollouts (repeat G, reshard,
detokenize; padding: prompts and packed batches; rollout_memory: sequences
per call; journal: a stopped rollout's finished rows), segments, tree rollouts
(tree, tree_forks; tree_loop: a loop generate_fn), and scoring of sampled
completions (pass@k, maj@k).

Imports model/ and the bottom modules.
"""
