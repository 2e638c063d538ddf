"""Continuous batching == the static sampler, row by row.

The static sampler (sampler.sample) is the reference: for the same row keys
the continuous sampler must return the same tokens, masks, lengths and
finish reasons, and the same log-probs (fp32, to rounding), whatever slot a
row ran in and whenever it was admitted.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.model import transformer
from rlreason.sampling import continuous
from rlreason.sampling import continuous_loop
from rlreason.sampling import engine
from rlreason.sampling import sampler
from rlreason.sampling.draw import Sampling

CFG = testing.tiny_model_config(qkv_bias=True)
PAD = 0
T = 9
# Ragged prompts (left padded to P = 7), more rows than slots.
LENGTHS = (7, 2, 5, 1, 6, 3, 7, 4, 2, 5, 1)
KEY = jax.random.key(3)


@pytest.fixture(scope="module")
def params():
  params = transformer.init(CFG, jax.random.key(0))
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8
  return params


def _prompts(lengths=LENGTHS, seed=0):
  """Left-padded prompts [N, P] and positions, as numpy arrays."""
  return testing.left_padded_prompts(lengths, CFG.vocab_size, PAD, seed)


def _both(params, sampling, stop_ids, slots=3, **kwargs):
  tokens, positions = _prompts()
  common = dict(
    model_cfg=CFG,
    max_new_tokens=T,
    sampling=sampling,
    stop_ids=stop_ids,
    pad_id=PAD,
    row_limits=kwargs.pop("row_limits", None),
    stop_sequences=kwargs.pop("stop_sequences", ()),
  )
  ref = sampler.sample(params, tokens, positions, KEY, **common)
  out, stats = continuous.sample(
    params,
    tokens,
    positions,
    KEY,
    slots=slots,
    return_stats=True,
    **common,
    **kwargs,
  )
  return ref, out, stats


def _assert_same(ref, out):
  for name in ("tokens", "mask", "lengths", "finish"):
    np.testing.assert_array_equal(
      np.asarray(getattr(out, name)), np.asarray(getattr(ref, name)), name
    )
  for name in ("logp", "policy_logp"):
    np.testing.assert_allclose(
      np.asarray(getattr(out, name)),
      np.asarray(getattr(ref, name)),
      rtol=1e-5,
      atol=1e-5,
      err_msg=name,
    )


def _first_token_stop(params, sampling):
  """Stop ids: row 3's first token (so it stops at once), and tokens of
  rows 0 and 5 (so they stop early)."""
  tokens, positions = _prompts()
  ref = sampler.sample(
    params, tokens, positions, KEY, model_cfg=CFG, max_new_tokens=T,
    sampling=sampling, pad_id=PAD,
  )  # fmt: skip
  picks = (ref.tokens[3, 0], ref.tokens[0, 2], ref.tokens[5, 4])
  return tuple(dict.fromkeys(int(i) for i in picks))


@pytest.mark.parametrize(
  "sampling",
  [Sampling(temperature=0.0), Sampling(temperature=0.8)],
  ids=["greedy", "sampled"],
)
@pytest.mark.parametrize(
  "mode", [dict(), dict(refill="host", refill_every=3, refill_rows=2)]
)
def test_equals_static_sampler(params, sampling, mode):
  stop_ids = _first_token_stop(params, sampling)
  ref, out, stats = _both(params, sampling, stop_ids, **mode)
  _assert_same(ref, out)
  lengths = np.asarray(ref.lengths)
  finish = np.asarray(ref.finish)
  # The cases the issue names are in the batch.
  assert lengths[3] == 1 and finish[3] == sampler.FINISH_EOS
  assert (lengths == T).any() and (finish == sampler.FINISH_LENGTH).any()
  assert (lengths < T).sum() >= 2
  # Token 0 of every row comes from its prefill, the rest from decode steps.
  assert stats.busy == lengths.sum() - len(lengths)
  assert stats.prefills >= -(-len(LENGTHS) // (mode.get("refill_rows") or 1))


@pytest.mark.parametrize(
  "mode", [dict(), dict(refill="host", refill_every=3, refill_rows=2)]
)
def test_progress_reports_rows_finished_and_samples_alike(
  params, monkeypatch, mode
):
  """With a progress callback the loop runs in host calls of
  PROGRESS_STEPS decode steps (refill="host": of one round), each but the
  last reporting the rows finished so far; the samples do not change.
  An `interrupt` callback is called after the same calls."""
  monkeypatch.setattr(engine, "PROGRESS_STEPS", 2)
  sampling = Sampling(temperature=0.8)
  stop_ids = _first_token_stop(params, sampling)
  _, quiet, quiet_stats = _both(params, sampling, stop_ids, **mode)
  reports, checks = [], []
  ref, out, stats = _both(
    params, sampling, stop_ids, progress=reports.append, **mode
  )
  _assert_same(ref, out)
  _assert_same(quiet, out)
  assert stats == quiet_stats
  # `interrupt` alone runs the same host calls, called where progress is.
  _, alone, alone_stats = _both(
    params, sampling, stop_ids, interrupt=lambda: checks.append(1), **mode
  )
  _assert_same(quiet, alone)
  assert alone_stats == quiet_stats and len(checks) == len(reports)
  assert reports == sorted(reports), reports
  assert 0 <= reports[0] and reports[-1] < len(LENGTHS), reports
  if mode:  # one call per round: at least one per refill but the last
    assert len(reports) >= stats.prefills - 1
  else:  # calls of exactly 2 decode steps (refill_every=1) but the last
    assert len(reports) >= stats.steps // 2 - 1, (reports, stats)


def test_the_host_loop_holds_no_copy_of_the_weights(params):
  """loop.start's outputs (what the host keeps between calls) are the
  slots' state and rows, not a cast copy of the weights; round_jit casts
  them inside, as run does."""
  tokens, positions = _prompts()
  static = dict(
    model_cfg=CFG, max_new_tokens=T, sampling=Sampling(), stop_ids=(),
    pad_id=PAD, mesh=None, stop_sequences=(), slots=3, refill_rows=1,
    refill_every=1,
  )  # fmt: skip
  limits = np.full((len(tokens),), T, np.int32)
  args = (params, tokens, positions, KEY, np.uint32(0), limits)
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  out = jax.eval_shape(
    functools.partial(continuous_loop.start, **static), *args
  )
  assert len(out) == 2  # (state, rows)
  held = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(out))
  assert held < weights / 4, (held, weights)


def test_filters_stop_sequences_and_row_limits(params):
  limits = np.asarray([1, 9, 4, 2, 9, 7, 3, 9, 5, 6, 8], np.int32)
  ref, out, _ = _both(
    params,
    Sampling(temperature=1.3, top_k=20, top_p=0.9),
    (5, 6),
    slots=4,
    stop_sequences=((11, 12), (13, 14, 15)),
    row_limits=limits,
  )
  _assert_same(ref, out)
  lengths = np.asarray(ref.lengths)
  assert (lengths <= limits).all()
  hit_limit = (lengths == limits) & (np.asarray(ref.finish) == 0)
  assert hit_limit.sum() >= 3  # the budgets end rows, with finish "length"


def test_row_limits_cut_the_unlimited_samples(params):
  """A budget only truncates a row: its first tokens are the same."""
  tokens, positions = _prompts()
  kw = dict(model_cfg=CFG, max_new_tokens=T, sampling=Sampling(), pad_id=PAD)
  full = sampler.sample(params, tokens, positions, KEY, **kw)
  limits = np.asarray([2, 9, 4, 2, 9, 7, 3, 9, 5, 6, 1], np.int32)
  cut = sampler.sample(params, tokens, positions, KEY, row_limits=limits, **kw)
  np.testing.assert_array_equal(np.asarray(cut.lengths), limits)
  for i, n in enumerate(limits):
    np.testing.assert_array_equal(cut.tokens[i, :n], full.tokens[i, :n])
    assert (np.asarray(cut.tokens[i, n:]) == PAD).all()


def test_same_shapes_do_not_recompile(params):
  _both(params, Sampling(), (5,))
  before = continuous.cache_size()
  _, _, stats = _both(params, Sampling(), (5,))
  assert continuous.cache_size() == before
  assert 0 < stats.utilisation <= 1


def test_sharded_slots_equal_single_device(params):
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  tokens, positions = _prompts()
  kw = dict(
    model_cfg=CFG, max_new_tokens=T, sampling=Sampling(), stop_ids=(5, 6),
    pad_id=PAD, slots=4,
  )  # fmt: skip
  one = continuous.sample(params, tokens, positions, KEY, **kw)
  sharded = continuous.sample(
    jax.device_put(params, mesh_lib.replicated(mesh)),
    jnp.asarray(tokens),
    jnp.asarray(positions),
    KEY,
    mesh=mesh,
    **kw,
  )
  _assert_same(one, sharded)


def test_a_refill_writes_each_row_on_its_own_device():
  # Slots taken shard by shard (continuous_loop._free_slots): the refill
  # rows' K / V [R, K, P, Dh] stay where their prefill ran. With free
  # slots chosen across shards, the compiled loop all-gathered them to
  # every device (4 such all-gathers here: 2 layers' K and V; a 32B
  # model's 25.6k-token refill on v5p-256 gathered 800 GiB per chip).
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  rows, prompt = 16, 32
  ids = jax.ShapeDtypeStruct((rows, prompt), jnp.int32)
  hlo = (
    engine.jitted(continuous_loop.run, None, **continuous_loop.RUN_JIT)
    .lower(
      jax.device_put(transformer.init(CFG, jax.random.key(0)),
                     mesh_lib.replicated(mesh)),
      ids, ids, KEY, 0, jax.ShapeDtypeStruct((rows,), jnp.int32),
      model_cfg=CFG, max_new_tokens=T, sampling=Sampling(), stop_ids=(5,),
      pad_id=PAD, mesh=mesh, stop_sequences=(), slots=8, refill_rows=4,
      refill_every=1,
    )
    .compile()
    .as_text()
  )  # fmt: skip
  collectives = re.findall(
    r"= (f32\[[\d,]*\])\S* (?:all-gather|all-reduce|all-to-all)", hlo
  )
  assert collectives, "no collectives found: the pattern is stale"
  assert not [c for c in collectives if c.count(",") >= 3], collectives


def test_default_refill_rows_split_over_the_batch_shards():
  assert continuous.default_refill_rows(64) == 8  # an eighth of the slots
  assert continuous.default_refill_rows(5) == 1
  # gspo's preset on v5p-128: 1216 slots over 64 chips; 152 rows would not
  # split, so every chip would prefill all of them.
  assert continuous.default_refill_rows(1216, 64) == 192
  assert continuous.default_refill_rows(16, 4) == 4
  assert continuous.default_refill_rows(2, 4) == 2  # at most the slots


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(slots=0), "slots=0 must be an int >= 1"),
    (dict(slots=2, refill_every=0), "refill_every=0"),
    (dict(slots=2, refill="disk"), "refill='disk'"),
    (dict(slots=2, refill_rows=3), r"refill_rows=3 must be in \[0, 2\]"),
    (dict(slots=2, row_limits=np.full(11, 10)), "row_limits must be in"),
  ],
)
def test_bad_input_fails_before_compiling(params, kwargs, match):
  tokens, positions = _prompts()
  with pytest.raises(ValueError, match=match):
    continuous.sample(
      params, tokens, positions, KEY, model_cfg=CFG, max_new_tokens=T,
      **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("mesh_shape", [None, (2, 2, 2)], ids=["one", "mesh"])
def test_ragged_decode_attention_gives_the_dense_samples(params, mesh_shape):
  """decode_attention="ragged" (the Pallas decode kernel, interpret mode on
  CPU) reads each row's filled slots only: the static and the continuous
  sampler (refilled slots: stale slots past a row's index) give the dense
  static sampler's samples, on one device and sharded."""
  ragged = dataclasses.replace(CFG, decode_attention="ragged")
  sampling = Sampling(temperature=0.8)
  stop_ids = _first_token_stop(params, sampling)
  tokens, positions = _prompts()
  kw = dict(
    max_new_tokens=T, sampling=sampling, stop_ids=stop_ids, pad_id=PAD
  )  # fmt: skip
  ref = sampler.sample(params, tokens, positions, KEY, model_cfg=CFG, **kw)
  args = (params, tokens, positions)
  if mesh_shape:
    mesh = mesh_lib.make_mesh(*mesh_shape)
    kw["mesh"] = mesh
    args = (
      jax.device_put(params, mesh_lib.replicated(mesh)),
      jnp.asarray(tokens),
      jnp.asarray(positions),
    )
  static = sampler.sample(*args, KEY, model_cfg=ragged, **kw)
  cont = continuous.sample(*args, KEY, model_cfg=ragged, slots=4, **kw)
  _assert_same(ref, static)
  _assert_same(ref, cont)
