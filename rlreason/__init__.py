"""rlreason: JAX-native RL for language-model reasoning.

The package's folders are its layers, bottom to top; a layer imports only
the layers below it (tests/layers_test.py enforces it):

  mesh, devices, types, config,           shared records, axes, devices and
  storage, metrics                        run files
  model/      the decoder, its presets, HF IO, tokenizers, policy scores
  sampling/   KV-cache sampling, rollouts, segments, trees, scoring
  rl/         advantages, returns, losses, KL, objectives, critics
  data/       prompt sources, procedural tasks, curricula, allocation
  rewards/    verifiers and reward functions (host side)
  guidance/   hints, off-policy traces, guided re-sampling
  envs/       text environments and multi-turn rollouts
  train/      the loop, train step, SFT, checkpoints, reports, flags
  eval/       trained policies, checkpoint evaluation, teachers, claims'
              reports
"""

__version__ = "0.1.0"
