"""Vocab-sized primitives of the token draw (draw.py): argmax, inverse-CDF
draws and the nucleus threshold, all over [N, V] logits.

XLA:CPU is slow at argmax (a variadic reduce), cumsum over long axes and
sorts, and threefry bits for every vocab entry (jax.random.categorical)
cost more than the model's decode step. So: two-level scans over blocks of
the vocab, B ~ sqrt(V) wide (one pass over the NB = V / B block summaries,
one inside the chosen block), and one uniform per row:

  argmax:       best block by its max, then the first max inside it.
  inverse_cdf:  i = min{i : sum_{j<=i} e_j > u * sum(e)}, block then inner.
  nucleus:      the largest t with sum(e[z >= t]) >= top_p * sum(e), by a
                32-step bisection on the monotone uint32 image of the floats.

Shapes: N rows, V vocab, B block size, NB = ceil(V / B) blocks.
"""

import math

import jax
import jax.numpy as jnp


def take(x: jax.Array, ids: jax.Array) -> jax.Array:
  """x [N, V], ids [N] -> x[n, ids[n]] [N]."""
  return jnp.take_along_axis(x, ids[:, None], axis=-1)[:, 0]


def _block_size(v: int) -> int:
  """A power of two near sqrt(V), so both levels scan ~sqrt(V) entries."""
  return 1 << max(3, math.ceil(math.log2(v) / 2))


def _blocked(x: jax.Array, fill: float) -> jax.Array:
  """[N, V] -> [N, V / B, B], padded with `fill`."""
  n, v = x.shape
  b = _block_size(v)
  nb = -(-v // b)
  if nb * b != v:
    x = jnp.pad(x, ((0, 0), (0, nb * b - v)), constant_values=fill)
  return x.reshape(n, nb, b)


def _first(cond: jax.Array) -> jax.Array:
  """[N, M] bool -> [N] index of the first True (M if none)."""
  m = cond.shape[-1]
  iota = jnp.arange(m, dtype=jnp.float32)[None, :]
  return jnp.min(jnp.where(cond, iota, float(m)), axis=-1).astype(jnp.int32)


def _last(cond: jax.Array) -> jax.Array:
  """[N, M] bool -> [N] index of the last True (0 if none)."""
  iota = jnp.arange(cond.shape[-1], dtype=jnp.float32)[None, :]
  return jnp.max(jnp.where(cond, iota, 0.0), axis=-1).astype(jnp.int32)


def argmax(logits: jax.Array) -> jax.Array:
  """[N, V] -> [N] int32 index of the first maximum (== jnp.argmax)."""
  x = _blocked(logits, -jnp.inf)  # [N, NB, B]
  block_max = jnp.max(x, axis=-1)  # [N, NB]
  best = jnp.max(block_max, axis=-1, keepdims=True)  # [N, 1]
  block = _first(block_max == best)
  inner = jnp.take_along_axis(x, block[:, None, None], axis=1)[:, 0]
  return block * x.shape[-1] + _first(inner == best)


def inverse_cdf(e: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Index i with probability e_i / sum(e), by inverting the CDF at u.

  Two levels: choose a block of the vocab from the block masses, then a
  token inside it. Entries with e_i = 0 are never chosen.

  Args:
    e: [N, V] unnormalised probabilities, >= 0, some > 0 in every row.
    u: [N] uniform in [0, 1).

  Returns:
    index [N] int32, and the total mass sum(e) [N].
  """
  x = _blocked(e, 0.0)  # [N, NB, B]
  mass = jnp.sum(x, axis=-1)  # [N, NB]
  cum = jnp.cumsum(mass, axis=-1)
  total = cum[:, -1]
  target = (u * total)[:, None]  # [N, 1]
  # The first block whose cumulative mass passes the target; rounding can
  # leave none, then the last block with mass.
  block = jnp.minimum(_first((cum > target) & (mass > 0)), _last(mass > 0))
  inner = jnp.take_along_axis(x, block[:, None, None], axis=1)[:, 0]
  before = take(cum - mass, block)[:, None]  # [N, 1]
  inner_cum = before + jnp.cumsum(inner, axis=-1)  # [N, B]
  index = jnp.minimum(
    _first((inner_cum > target) & (inner > 0)), _last(inner > 0)
  )
  return block * x.shape[-1] + index, total


def nucleus_threshold(z: jax.Array, top_p: float) -> jax.Array:
  """Smallest kept logit of the top-p nucleus of softmax(z), by bisection.

  Finds the largest t among the values of z with mass(z >= t) >= top_p:
  32 masked sums over [N, V] on the monotone uint32 image of the floats,
  exact (ties kept), and much cheaper than a sort on CPU.

  Args:
    z: [N, V] fp32 logits (finite or -inf).
    top_p: in (0, 1).

  Returns:
    [N, 1] threshold: keep z >= threshold.
  """
  e = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))
  goal = top_p * jnp.sum(e, axis=-1, keepdims=True)  # [N, 1]
  bits = jax.lax.bitcast_convert_type(z, jnp.uint32)
  # Order-preserving map of floats to uint32: flip all bits of negatives,
  # only the sign bit of positives.
  neg = bits >= jnp.uint32(1 << 31)
  key = jnp.where(neg, ~bits, bits | jnp.uint32(1 << 31))
  lo = jnp.min(key, axis=-1, keepdims=True)  # mass(z >= lo) = 1 >= top_p
  hi = jnp.max(key, axis=-1, keepdims=True)

  def body(_, bounds):  # invariant: answer in [lo, hi]
    lo, hi = bounds
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # upper middle: no overflow
    ok = jnp.sum(jnp.where(key >= mid, e, 0.0), axis=-1, keepdims=True) >= goal
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))
  # Back from the key to the float.
  neg = lo < jnp.uint32(1 << 31)
  bits = jnp.where(neg, ~lo, lo & jnp.uint32((1 << 31) - 1))
  return jax.lax.bitcast_convert_type(bits, jnp.float32)
