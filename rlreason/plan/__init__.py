"""Layer 10, plan (top): ahead-of-time planning. Compiles a run's programs
for a named TPU slice (libtpu, on a CPU host) or the local backend, and
reports per-chip memory, fit, the largest buffers and a roofline step time.

Imports every layer below it.
"""
