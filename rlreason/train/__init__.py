"""Layer 8, train: the shared RL loop and its run context, the jitted train
step and optimizer, supervised warm starts, the reward-model stage of
RLHF, the synthetic pretraining corpus of the laptop base model,
checkpoints, stops on request (preemption), reports and the flags
generated from a Config.

Imports every layer below it (envs/ ... model/) and the bottom modules.
"""
