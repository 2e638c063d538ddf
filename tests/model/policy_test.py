"""Chunked completion scores == one block, values and gradients; the
activation constraints change no number."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.model import blocks
from rlreason.model import policy
from rlreason.model import transformer
from rlreason.rl import entropy_reg


def _inputs(n=3, p=4, t=7, seed=0):
  cfg = testing.tiny_model_config()
  params = transformer.init(cfg, jax.random.key(seed))
  tokens = jax.random.randint(
    jax.random.key(seed + 1), (n, p + t), 0, cfg.vocab_size
  )
  positions = jnp.broadcast_to(jnp.arange(p + t), tokens.shape)
  positions = positions.at[0, :2].set(-1)  # a left-padded row
  return cfg, params, tokens, positions, p


def test_logits_chunk_size():
  assert policy.logits_chunk(2, 10, 100) is None  # small: one block
  budget = policy.LOGITS_CHUNK_BYTES
  chunk = policy.logits_chunk(64, 1024, 152064)
  assert chunk is not None and 64 * chunk * 152064 * 4 <= budget
  assert policy.logits_chunk(1, 10**6, 10**9) == 1  # at least one token


# Functions of the whole distribution (entropy_reg's, as SIREN and Lp-Reg
# use them): the nucleus entropy keeps its threshold through the remat
# (policy.SAVED), the min-p proxy is -inf where it filters the target.
PER_TOKEN = (
  lambda z, _: entropy_reg.nucleus_entropy(z, 0.8),
  lambda z, y: jnp.maximum(
    entropy_reg.minp_proxy_logprobs(z, y, kappa=0.3), -30.0
  ),
)


def _all_scores(params, tokens, positions, cfg, p):
  """(logp, entropy, nucleus entropy, proxy log-prob), each [N, T]."""
  return policy.completion_logprobs(
    params,
    tokens,
    positions,
    cfg,
    p,
    temperature=0.7,
    with_entropy=True,
    per_token=PER_TOKEN,
  )


@pytest.mark.parametrize("chunk_tokens", [1, 3, 5])
def test_chunked_scores_equal_one_block(monkeypatch, chunk_tokens):
  cfg, params, tokens, positions, p = _inputs()
  n, t, v = tokens.shape[0], tokens.shape[1] - p, cfg.vocab_size

  def scores(params):
    logp, ent, nucleus, proxy = _all_scores(params, tokens, positions, cfg, p)
    weights = jnp.linspace(0.5, 1.5, t)[None]
    loss = (logp * weights).sum() + ent.sum() + (nucleus * weights).sum()
    return loss, (logp, ent, nucleus, proxy)

  (loss, outs), grads = jax.value_and_grad(scores, has_aux=True)(params)
  assert outs[2].shape == (n, t) and float(outs[2].max()) > 0.1
  # A budget of chunk_tokens tokens per block (T = 7: 3 and 5 pad the end).
  monkeypatch.setattr(policy, "LOGITS_CHUNK_BYTES", n * chunk_tokens * v * 4)
  assert policy.logits_chunk(n, t, v) == chunk_tokens
  (loss_c, outs_c), grads_c = jax.value_and_grad(scores, has_aux=True)(params)
  for a, b in zip(outs_c, outs, strict=True):  # logp, entropy, per_token
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(loss_c, loss, rtol=1e-6, atol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    grads_c,
    grads,
  )


def test_activation_constraints_change_no_number():
  cfg, params, tokens, positions, p = _inputs(n=8)
  plain = policy.completion_logprobs(params, tokens, positions, cfg, p)
  mesh = mesh_lib.make_mesh(2, 2, 2)
  with mesh_lib.activation_mesh(mesh):
    sharded = policy.completion_logprobs(params, tokens, positions, cfg, p)
    assert mesh_lib.active_mesh() is mesh
  assert mesh_lib.active_mesh() is None
  np.testing.assert_allclose(sharded, plain, rtol=1e-5, atol=1e-5)


def _residual_constraints(d_model, fn, *args) -> list:
  """The specs of fn's sharding constraints on [N, S, d_model] activations."""
  return [
    eqn.params["sharding"].spec
    for eqn in testing.jaxpr_eqns(fn, *args)
    if eqn.primitive.name == "sharding_constraint"
    and eqn.invars[0].aval.ndim == 3
    and eqn.invars[0].aval.shape[-1] == d_model
  ]


def test_sequence_parallel_splits_the_residual_and_changes_no_number(
  monkeypatch,
):
  """ModelConfig.sequence_parallel on a (1, 2, 4) mesh: between layers the
  residual stream's 16 tokens are split over tensor (4 ways) as well as
  its rows over fsdp; rematerialised layers' values and gradients as on
  one device, unrolled and scanned (ModelConfig.scan_layers), with the
  saved inputs offloaded (remat_policy="offload") too. The embedding's
  gradient is scatter-added in four strided chunks of 4 positions, one
  from each tensor device's 4 (blocks.embed_chunks)."""
  monkeypatch.setattr(blocks, "EMBED_GRAD_CHUNK", 5)
  cfg, params, tokens, positions, p = _inputs(n=4, p=4, t=12)
  cfg = cfg.__class__(**{**cfg.__dict__, "remat": True})
  mesh = mesh_lib.make_mesh(1, 2, 4)

  def loss(params, cfg):
    return policy.completion_logprobs(params, tokens, positions, cfg, p).sum()

  plain, g_plain = jax.value_and_grad(loss)(params, cfg)
  shardings = mesh_lib.shardings(
    mesh,
    transformer.param_axes(cfg),
    mesh_lib.TRAIN_RULES,
    transformer.param_shapes(cfg),
  )
  on_mesh = jax.device_put(params, shardings)
  # And with the layers under one lax.scan (ModelConfig.scan_layers):
  # its body's constraints, the weights stacked and sliced on the mesh.
  combos = ((False, False, "full"), (True, False, "full"), (True, True, "full"))
  for split, scan, keep in (*combos, (True, True, "offload")):
    c = cfg.__class__(
      **{
        **cfg.__dict__,
        "sequence_parallel": split,
        "scan_layers": scan,
        "remat_policy": keep,
      }
    )

    def sharded(params, c=c):
      with mesh_lib.activation_mesh(mesh):
        return jax.value_and_grad(loss)(params, c)

    specs = _residual_constraints(cfg.d_model, sharded, on_mesh)
    # The embedding's output and each layer's two sums, forward and in
    # the rematerialised forward of the backward pass (a scan's body
    # once).
    assert len(specs) >= 1 + 2 * (1 if scan else cfg.n_layers), specs
    batch = ("data", "fsdp")
    want = P(batch, "tensor", None) if split else P(batch, None, None)
    assert all(s == want for s in specs), specs
    value, grads = jax.jit(sharded)(on_mesh)
    np.testing.assert_allclose(value, plain, rtol=1e-5, atol=1e-5)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-6),
      grads,
      g_plain,
    )


def test_constrain_lays_out_by_batch():
  mesh = mesh_lib.make_mesh(2, 4, 1)
  x = jnp.ones((8, 3, 16))

  @jax.jit
  def f(x):
    with mesh_lib.activation_mesh(mesh):
      return mesh_lib.constrain(x * 2, ("batch", "seq", "embed"))

  out = f(x)
  assert out.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
  assert mesh_lib.constrain(x, ("batch", "seq", "embed")) is x  # no mesh


@pytest.mark.parametrize("rows", [0, 2, 5])
def test_scoring_by_rows_equals_one_call(rows):
  cfg, params, tokens, positions, p = _inputs(n=5)
  whole = policy.completion_logprobs(
    params, tokens, positions, cfg, p, with_entropy=True
  )
  parts = policy.completion_logprobs_by_rows(
    params, tokens, positions, cfg, p, rows=rows, with_entropy=True
  )
  for a, b in zip(parts, whole):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tie", [False, True])
def test_vocab_parallel_chunks_on_a_mesh_equal_one_device(monkeypatch, tie):
  """Chunked scores on a 2x2x2 mesh split the vocab projection over all 8
  devices (V = 128): values and gradients as on one device, and the
  projection's gradient leaves the step split as the parameter is."""
  cfg, _, tokens, positions, p = _inputs(n=8)
  cfg = cfg.__class__(**{**cfg.__dict__, "tie_embeddings": tie})
  params = transformer.init(cfg, jax.random.key(3))
  n, t, v = tokens.shape[0], tokens.shape[1] - p, cfg.vocab_size
  monkeypatch.setattr(policy, "LOGITS_CHUNK_BYTES", n * 3 * v * 4)
  mesh = mesh_lib.make_mesh(2, 2, 2)
  weights = jnp.linspace(0.5, 1.5, t)[None]

  def loss(params):
    logp, ent, nucleus, proxy = _all_scores(params, tokens, positions, cfg, p)
    per_token = nucleus + 0.1 * proxy  # the proxy has no gradient
    return (logp * weights).sum() + ent.sum() + (per_token * weights).sum()

  plain, g_plain = jax.value_and_grad(loss)(params)
  shardings = mesh_lib.shardings(
    mesh,
    transformer.param_axes(cfg),
    mesh_lib.TRAIN_RULES,
    transformer.param_shapes(cfg),
  )

  @jax.jit
  def sharded(params):
    with mesh_lib.activation_mesh(mesh):
      assert mesh_lib.vocab_axes(v) == ("data", "fsdp", "tensor")
      return jax.value_and_grad(loss)(params)

  value, grads = sharded(jax.device_put(params, shardings))
  np.testing.assert_allclose(value, plain, rtol=1e-5, atol=1e-5)
  # atol: float32 sums split 8 ways round differently by CPU (an AMD
  # EPYC host, session 63: one gradient entry of 4096 off by 1.19e-6).
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-6),
    grads,
    g_plain,
  )
  head = "embedding" if tie else "lm_head"
  assert len(grads[head].sharding.device_set) == 8


def test_log_softmax_at_onehot_is_the_gather():
  z = jax.random.normal(jax.random.key(0), (3, 5, 11))
  y = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
  np.testing.assert_array_equal(
    policy.log_softmax_at(z, y, 0.7, onehot=True),
    policy.log_softmax_at(z, y, 0.7),
  )
