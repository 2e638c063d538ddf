"""Layer 3, rl: the RL math. Advantages and returns, loss aggregation, policy
losses, KL estimators, the composed objectives, token weights, entropy
regularisers and the entropy law, critics, dynamic sampling, tree and turn
credit assignment. Pure functions over arrays.

Imports sampling/, model/ and the bottom modules.
"""
