"""Loss aggregation: a per-token loss to a scalar, with explicit normalisers.

Shapes: N sequences, T completion length; `per_token` and `mask` are [N, T]
(mask 1 = completion token). Every mode of `aggregate` is
  sum_i w_i sum_t m_it l_it / C,    w_i = 1 or 1 / |o_i|,
with C a batch-level constant (num_tokens, num_seqs or num_seqs * max_len),
so with the constants of the WHOLE batch (`normalizers`, computed before the
split into micro-batches, or with a psum across shards) the losses and
gradients of micro-batches or shards sum to the full-batch values
(`accumulate`: the sum over micro-batches in a scan, which the train step
and the reward model's Bradley-Terry step run). Policy losses (losses.py)
and KL estimators (kl.py) return per-token values that are reduced here.
"""

import chex
import jax
import jax.numpy as jnp

AGGREGATION_MODES = (
  "token-mean",
  "token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-sum-norm",
)


def normalizers(mask: jax.Array, **masks: jax.Array) -> dict[str, jax.Array]:
  """The batch-level denominators `aggregate` uses by default.

  Compute them once on the whole batch (before splitting it into micro-
  batches, or with a psum across shards) and pass them to `aggregate`.

  Args:
    mask: [N, T] completion-token mask.
    **masks: other token masks of the batch (T-PPO's critic's
      value_mask=...): each adds its count, "<name>_tokens".

  Returns:
    {"num_tokens": number of mask = 1 tokens,
     "num_seqs": number of sequences with at least one such token,
     "<name>_tokens": the count of each of `masks`}.
  """
  m = mask > 0
  out = {
    "num_tokens": m.sum().astype(jnp.float32),
    "num_seqs": m.any(-1).sum().astype(jnp.float32),
  }
  for name, other in masks.items():
    out[f"{name}_tokens"] = (other > 0).sum().astype(jnp.float32)
  return out


def aggregate(
  per_token: jax.Array,
  mask: jax.Array,
  mode: str = "token-mean",
  *,
  num_tokens: jax.Array | float | None = None,
  num_seqs: jax.Array | float | None = None,
  max_len: int | None = None,
  **other_counts: jax.Array,
) -> jax.Array:
  """Reduces a per-token loss to a scalar with an explicit normaliser.

  With m the mask, l the per-token loss, |o_i| = sum_t m_it:
    token-mean               sum_it m l / num_tokens   (DAPO, arXiv:2503.14476)
    token-sum                sum_it m l
    seq-mean-token-mean      sum_i (sum_t m l / |o_i|) / num_seqs   (GRPO)
    seq-mean-token-sum       sum_i sum_t m l / num_seqs
    seq-mean-token-sum-norm  sum_it m l / (num_seqs * max_len)
                             (Dr. GRPO, arXiv:2503.20783: a constant that
                             does not depend on the sampled lengths)
  Every mode is a sum over sequences divided by a batch-level constant, so
  with num_tokens / num_seqs of the WHOLE batch (see `normalizers`) the
  losses, and gradients, of micro-batches or shards sum to the full-batch
  values. The defaults are the local batch's: `normalizers(mask)`, and
  max_len = T (verl's default; pass the generation budget instead, as
  Dr. GRPO, so the constant does not change with padding).

  Args:
    per_token: [N, T] per-token loss.
    mask: [N, T] completion-token mask.
    mode: one of AGGREGATION_MODES.
    num_tokens: global number of valid tokens (token-mean).
    num_seqs: global number of non-empty sequences (seq-mean-* modes).
    max_len: Dr. GRPO's constant (seq-mean-token-sum-norm).
    **other_counts: `normalizers`' counts of other masks ("<name>_tokens"),
      accepted so its whole dict can be passed; not used here.

  Returns:
    Scalar loss. Empty batches give 0.
  """
  unknown = [k for k in other_counts if not k.endswith("_tokens")]
  if unknown:
    raise TypeError(f"aggregate() got unexpected keyword arguments {unknown}")
  chex.assert_equal_shape([per_token, mask])
  masked = jnp.where(mask > 0, per_token, 0.0)
  m = jnp.asarray(mask > 0, masked.dtype)
  if num_tokens is None:
    num_tokens = normalizers(mask)["num_tokens"]
  if num_seqs is None:
    num_seqs = normalizers(mask)["num_seqs"]
  if mode == "token-mean":
    return masked.sum() / jnp.maximum(num_tokens, 1.0)
  if mode == "token-sum":
    return masked.sum()
  if mode == "seq-mean-token-mean":
    seq = masked.sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    return seq.sum() / jnp.maximum(num_seqs, 1.0)
  if mode == "seq-mean-token-sum":
    return masked.sum() / jnp.maximum(num_seqs, 1.0)
  if mode == "seq-mean-token-sum-norm":
    max_len = per_token.shape[-1] if max_len is None else max_len
    return masked.sum() / (jnp.maximum(num_seqs, 1.0) * max_len)
  raise ValueError(
    f"Unknown aggregation mode {mode!r}; valid modes: {AGGREGATION_MODES}."
  )


def micro_batch(batch, micro_batches: int, i):
  """Rows i, i+M, i+2M, ... of every [N, ...] leaf of `batch`: with the
  batch sharded in contiguous blocks, every device keeps contributing
  equally and no data moves."""

  def take(x):
    x = x.reshape((x.shape[0] // micro_batches, micro_batches) + x.shape[1:])
    return jax.lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False)

  return jax.tree.map(take, batch)


def accumulate(grad_fn, params, batch, micro_batches: int, *args):
  """`grad_fn(params, batch, *args) -> ((loss, aux), grads)` over
  `micro_batches` micro-batches (micro_batch's rows) in a lax.scan:
  ((summed loss, aux averaged over micro-batches), summed gradients).
  With each micro-batch's loss normalised by the whole batch's
  denominators, the sums are the whole batch's loss and gradient, and
  one micro-batch's activations are live at a time."""
  if micro_batches == 1:
    return grad_fn(params, batch, *args)

  def body(carry, i):
    (loss, aux), grads = grad_fn(
      params, micro_batch(batch, micro_batches, i), *args
    )
    acc_loss, acc_grads = carry
    return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), aux

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss, grads), aux = jax.lax.scan(
    body, (jnp.zeros((), jnp.float32), zeros), jnp.arange(micro_batches)
  )
  return (loss, jax.tree.map(lambda m: m.mean(0), aux)), grads
