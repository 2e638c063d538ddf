"""One decode step's token draw: filters, log-probs and per-row keys.

`Sampling` says how a token is drawn from the logits of one step
(temperature, then the top-k, top-p and min-p filters, as HF `generate` and
vLLM order them): `sampling_logits` is the distribution actually sampled
from, `draw` samples one token per row with its log-probs under it and
under the untempered policy. `row_keys` and `step_keys` give each row its
own key and each decode step its own fold of it, so a row's tokens do not
depend on the other rows of the batch. The decode loops (sampler.py,
segments.py) call these once per step.

Shapes: N rows, V vocab.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.sampling.vocab_scan import argmax
from rlreason.sampling.vocab_scan import inverse_cdf
from rlreason.sampling.vocab_scan import nucleus_threshold
from rlreason.sampling.vocab_scan import take


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a token is drawn from the logits of one step (hashable, static).

  The filters apply in the order of HF `generate` and vLLM: temperature,
  then top-k, then top-p on the renormalised top-k distribution, then min-p.
  A filter at its neutral value (top_k=0, top_p=1, min_p=0) is skipped at
  trace time, so the default costs no sort.

  Attributes:
    temperature: logits are divided by it; 0 means greedy (argmax).
    top_k: keep the k most likely tokens (0 = off). Ties with the k-th
      value are kept too.
    top_p: keep the smallest set of most likely tokens whose probability
      reaches top_p (nucleus sampling, arXiv:1904.09751); 1 = off.
    min_p: keep tokens with p >= min_p * max p (arXiv:2407.01082); 0 = off.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(
        f"temperature={self.temperature} must be >= 0 (0 means greedy)"
      )
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r} must be an int >= 0 (0 = off)")
    if not 0 <= self.min_p < 1:
      raise ValueError(f"min_p={self.min_p} must be in [0, 1)")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  @property
  def is_policy(self) -> bool:
    """True when samples come from the untempered, unfiltered policy."""
    return (
      self.temperature == 1
      and self.top_k == 0
      and self.top_p == 1
      and self.min_p == 0
    )

  def sampling_logits(self, logits: jax.Array) -> jax.Array:
    """Logits of the distribution actually sampled from.

    Args:
      logits: [N, V] model logits.

    Returns:
      [N, V] fp32: logits / temperature, -inf on filtered-out tokens; for
      greedy, 0 at the (first) argmax and -inf elsewhere.
    """
    logits = logits.astype(jnp.float32)
    if self.greedy:
      ids = jnp.arange(logits.shape[-1])[None, :]
      return jnp.where(ids == argmax(logits)[:, None], 0.0, -jnp.inf)
    z = logits if self.temperature == 1 else logits / self.temperature
    v = z.shape[-1]
    top_k = self.top_k if 0 < self.top_k < v else 0
    threshold = None  # keep z >= threshold, [N, 1]
    if top_k:
      vals = jax.lax.top_k(z, top_k)[0]  # [N, k], descending
      threshold = vals[:, -1:]
      if self.top_p < 1:
        # Nucleus of the renormalised top-k: keep a token if the mass
        # strictly before it is < top_p (the smallest prefix reaching it).
        probs = jax.nn.softmax(vals, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.where(before < self.top_p, vals, jnp.inf)
        threshold = jnp.min(kept, axis=-1, keepdims=True)
    elif self.top_p < 1:
      # A full-vocab sort is very slow on CPU: bisect for the threshold.
      threshold = nucleus_threshold(z, self.top_p)
    if self.min_p > 0:
      # p / max p = exp(z - max z), whatever the normaliser.
      floor = jnp.max(z, axis=-1, keepdims=True) + np.log(self.min_p)
      threshold = floor if threshold is None else jnp.maximum(threshold, floor)
    if threshold is None:
      return z
    return jnp.where(z >= threshold, z, -jnp.inf)

  def draw(
    self, logits: jax.Array, rng: jax.Array
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws one token per row.

    Args:
      logits: [N, V] model logits.
      rng: [N] keys, one per row (`row_keys`, `step_keys`): a row's draw
        does not depend on the other rows of the batch.

    Returns:
      tokens [N] int32; logp [N], the log-prob of each token under the
      sampling distribution (0 for greedy); policy_logp [N], its log-prob
      under the untempered policy, log softmax(logits).
    """
    logits = logits.astype(jnp.float32)
    if self.greedy:
      tokens = argmax(logits)
      return (
        tokens,
        jnp.zeros(tokens.shape, jnp.float32),
        take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1),
      )
    z = self.sampling_logits(logits)
    z_max = jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z - z_max)  # [N, V], 0 where filtered
    u = jax.vmap(lambda k: jax.random.uniform(k, ()))(rng)
    tokens, total = inverse_cdf(e, u)
    logp = take(z, tokens) - z_max[:, 0] - jnp.log(total)
    if self.is_policy:
      return tokens, logp, logp
    policy_logp = take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
    return tokens, logp, policy_logp


def row_keys(rng: jax.Array, n: int, row_offset=0) -> jax.Array:
  """[n] keys fold_in(rng, row_offset + i): row i's key of `sample` (and
  of segments.decode, offset 0). An [n] row_offset is each row's own index
  instead (a resumed rollout's unfinished rows: rollout.generate)."""
  rows = jnp.asarray(row_offset, jnp.uint32)
  if rows.ndim == 0:
    rows = rows + jnp.arange(n, dtype=jnp.uint32)
  elif rows.shape != (n,):
    raise ValueError(f"row_offset of shape {rows.shape}: expected () or ({n},)")
  return jax.vmap(jax.random.fold_in, (None, 0))(rng, rows)


def step_keys(keys: jax.Array, step) -> jax.Array:
  """[N] row keys -> the keys of decode step `step`, fold_in(key, step)."""
  return jax.vmap(jax.random.fold_in, (0, None))(keys, step)
