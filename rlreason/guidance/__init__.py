"""Layer 6, guidance: hints carried by prompts, off-policy traces mixed into
groups, and guided re-sampling of the groups that need help.

Imports rewards/, data/, rl/, sampling/, model/ and the bottom modules.
"""
