"""Rollouts: padding, groups, replay, resharding, sharded == single device."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason.sampling import rollout
from rlreason.sampling import rollout_layout
from rlreason.sampling import rollout_memory
from rlreason.sampling import sampler as sampling
from rlreason.sampling import draw
from rlreason.sampling import engine
from rlreason.sampling import stops
from rlreason import testing
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer

# Same model as sampling_test (vocab 128 for the char tokenizer), so that
# the compiled init is shared when both files run in one process.
CFG = testing.tiny_model_config(qkv_bias=True)
TOK = tokenizer_lib.load("char")
TEXTS = ["12+7=", "3*4=", "100-1=", "2+2="]  # B = 4 ragged prompts
G = 2
T = 12
STOPS = tuple(TOK.encode("0123"))  # frequent enough to stop some rows early


def _generate(
  params, step=0, texts=TEXTS, mesh=None, rng=None, model_cfg=CFG, **kwargs
):
  kwargs = {
    "max_new_tokens": T,
    "group_size": G,
    "bucket": 8,
    "sampling": draw.Sampling(temperature=1.0),
    "extra_stop_ids": STOPS,
    **kwargs,
  }
  return rollout.generate(
    params,
    [TOK.encode(t) for t in texts],
    jax.random.key(0) if rng is None else rng,
    step,
    model_cfg=model_cfg,
    tokenizer=TOK,
    mesh=mesh,
    **kwargs,
  )


def _train_layout(params, mesh):
  """`params` on `mesh` as training lays them out (TRAIN_RULES)."""
  train = mesh_lib.shardings(
    mesh,
    transformer.param_axes(CFG),
    mesh_lib.TRAIN_RULES,
    transformer.param_shapes(CFG),
  )
  return jax.device_put(params, train)


@pytest.fixture(scope="module")
def params():
  params = transformer.init(CFG, jax.random.key(0))
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8
  return params


@pytest.fixture(scope="module")
def ro(params):
  rng = jax.random.key(0)
  # Every transfer in generate is explicit.
  with jax.transfer_guard("disallow"):
    return _generate(params, step=3, rng=rng)


def test_rollout_fields(ro):
  n, p = len(TEXTS) * G, 8
  assert ro.prompt_len == p
  assert ro.tokens.shape == ro.positions.shape == (n, p + T)
  for x in (ro.logp, ro.policy_logp, ro.mask):
    assert x.shape == (n, T)
  np.testing.assert_array_equal(ro.prompt_ids, [0, 0, 1, 1, 2, 2, 3, 3])
  tokens = np.asarray(ro.tokens)
  np.testing.assert_array_equal(tokens[0::2, :p], tokens[1::2, :p])
  for i, text in enumerate(TEXTS):  # left padded prompts, in group order
    ids = TOK.encode(text)
    np.testing.assert_array_equal(tokens[G * i, p - len(ids) : p], ids)
  mask = np.asarray(ro.mask)
  np.testing.assert_array_equal(mask.sum(-1), ro.lengths)
  assert set(ro.finish_reasons) == {"eos", "length"}  # both happen
  for row, n_tok, reason, text in zip(
    tokens[:, p:], ro.lengths, ro.finish_reasons, ro.texts, strict=True
  ):
    assert text == TOK.decode(row[:n_tok].tolist())
    assert (reason == "eos") == (row[n_tok - 1] in STOPS + (TOK.eos_id,))
    assert (row[n_tok:] == TOK.pad_id).all()
  # Positions: counting from the first real token, -1 on padding.
  positions = np.asarray(ro.positions)
  real = np.concatenate([positions[:, :p] >= 0, mask > 0], axis=1)
  np.testing.assert_array_equal(
    positions, policy.positions_from_mask(jnp.asarray(real))
  )


def test_rollout_logp_match_recomputed(params, ro):
  logp = policy.completion_logprobs(
    params, ro.tokens, ro.positions, CFG, ro.prompt_len
  )
  mask = np.asarray(ro.mask, bool)
  np.testing.assert_allclose(
    np.asarray(ro.policy_logp)[mask],
    np.asarray(logp)[mask],
    rtol=1e-5,
    atol=1e-5,
  )
  # Temperature 1, no filters: both log-probs are the policy's.
  np.testing.assert_allclose(ro.logp, ro.policy_logp, rtol=1e-6, atol=1e-6)


def test_step_fold_in_replays_and_same_bucket_does_not_recompile(params, ro):
  before = sampling.cache_size()
  again = _generate(params, step=3)
  np.testing.assert_array_equal(again.tokens, ro.tokens)
  assert again.texts == ro.texts
  # Another step and shorter prompts in the same bucket: new samples, same
  # compiled sampler.
  other = _generate(params, step=4, texts=["1+1=", "9=", "7*7=", "5-3="])
  assert other.tokens.shape == ro.tokens.shape
  assert not np.array_equal(
    other.tokens[:, other.prompt_len :], ro.tokens[:, ro.prompt_len :]
  )
  assert sampling.cache_size() == before


def test_sharded_equals_single_device(params, ro):
  """Mesh 2x2x2 with train-layout params == one device, same rng."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  sharded = _generate(_train_layout(params, mesh), step=3, mesh=mesh)
  assert len(sharded.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(sharded.tokens, ro.tokens)
  np.testing.assert_array_equal(sharded.mask, ro.mask)
  np.testing.assert_allclose(sharded.logp, ro.logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    sharded.policy_logp, ro.policy_logp, rtol=1e-5, atol=1e-5
  )
  assert sharded.texts == ro.texts


def test_rollout_layout_stacks_gate_and_up(params):
  """on_mesh stacks each MLP's gate and up kernels [D, F] into one [D, 2, F]
  (bf16, split over tensor by F, as the two were); the logits of the
  stacked layout equal the two kernels'; stack_gate_up=False keeps them."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  laid, _ = rollout_layout.on_mesh(params, jax.random.key(0), mesh, CFG)
  mlp = laid["layer_0"]["mlp"]
  assert sorted(mlp) == ["down_kernel", "gate_up_kernel"]
  gate_up = mlp["gate_up_kernel"]
  assert gate_up.shape == (CFG.d_model, 2, CFG.mlp_dim)
  assert gate_up.dtype == CFG.compute_dtype
  assert gate_up.sharding.spec == jax.sharding.PartitionSpec(
    None, None, "tensor"
  )
  src = params["layer_0"]["mlp"]
  np.testing.assert_array_equal(gate_up[:, 0], src["gate_kernel"])
  np.testing.assert_array_equal(gate_up[:, 1], src["up_kernel"])
  tokens = jnp.asarray([[5, 6, 7, 8], [9, 10, 11, 12]])
  positions = jnp.broadcast_to(jnp.arange(4), tokens.shape)
  stacked, _ = transformer.apply(laid, tokens, positions, CFG)
  plain, _ = transformer.apply(params, tokens, positions, CFG)
  np.testing.assert_allclose(stacked, plain, rtol=1e-5, atol=1e-5)
  split_cfg = dataclasses.replace(CFG, stack_gate_up=False)
  laid, _ = rollout_layout.on_mesh(params, jax.random.key(0), mesh, split_cfg)
  assert sorted(laid["layer_0"]["mlp"]) == [
    "down_kernel",
    "gate_kernel",
    "up_kernel",
  ]
  assert jax.tree.structure(laid) == jax.tree.structure(
    rollout_layout.rollout_shardings(mesh, split_cfg)
  )


@pytest.mark.parametrize("layout", ["replicated", "fsdp"])
def test_rollout_layouts_sample_the_same(params, ro, layout):
  """--rollout_layout: the sampler's weights replicated over data x fsdp,
  or split over fsdp as in training (each decode step gathers them),
  sample what one device does."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  cfg = dataclasses.replace(CFG, rollout_layout=layout)
  laid, _ = rollout_layout.on_mesh(params, jax.random.key(0), mesh, cfg)
  specs = {str(x.sharding.spec) for x in jax.tree.leaves(laid)}
  assert any("fsdp" in s for s in specs) == (layout == "fsdp"), specs
  _assert_same_rollout(_generate(params, 3, mesh=mesh, model_cfg=cfg), ro)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_sequence_parallel_samples_the_same(params, ro, batching):
  """ModelConfig.sequence_parallel on a 2x2x2 mesh: prefills split their
  tokens over tensor between layers (the decode steps' one token stays
  whole); the samples are one device's."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  cfg = dataclasses.replace(CFG, sequence_parallel=True)
  got = _generate(
    _train_layout(params, mesh), 3, mesh=mesh, model_cfg=cfg,
    rows_per_call={"static": 0, "continuous": 3}[batching], batching=batching,
  )  # fmt: skip
  _assert_same_rollout(got, ro)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_rollout_tensor_samples_the_same_on_its_own_mesh(
  params, ro, batching, monkeypatch
):
  """--rollout_tensor: training over fsdp alone (8 devices), the sampler's
  weights split 2 or 4 ways over tensor on the same devices regrouped
  (mesh.rollout_mesh), replicated over the rest; it samples what one
  device does (static calls, or 3 continuous slots) and hands its rows
  back on the run's mesh, split over its batch axes."""
  mesh = mesh_lib.make_mesh(data=1, fsdp=8, tensor=1)
  on_mesh = _train_layout(params, mesh)
  rows = {"static": 0, "continuous": 3}[batching]
  sampled_on = testing.spy(
    monkeypatch, rollout, "_sample_rows", lambda *a, **k: k["mesh"]
  )
  for tensor in (2, 4):
    cfg = dataclasses.replace(CFG, rollout_tensor=tensor)
    sampling_mesh = rollout_layout.sampling_mesh(mesh, cfg)
    assert dict(sampling_mesh.shape) == {
      "data": 1, "fsdp": 8 // tensor, "tensor": tensor,
    }  # fmt: skip
    laid, _ = rollout_layout.on_mesh(
      on_mesh, jax.random.key(0), sampling_mesh, cfg
    )
    down = laid["layer_0"]["mlp"]["down_kernel"]
    assert down.sharding.mesh == sampling_mesh
    assert down.sharding.spec == jax.sharding.PartitionSpec("tensor", None)
    got = _generate(
      on_mesh, 3, mesh=mesh, model_cfg=cfg, rows_per_call=rows,
      batching=batching,
    )  # fmt: skip
    _assert_same_rollout(got, ro)
    assert set(sampled_on) == {sampling_mesh}
    sampled_on.clear()
    for x in (got.tokens, got.positions, got.logp, got.policy_logp, got.mask):
      assert x.sharding.mesh == mesh
      assert x.sharding.spec[0] in ("fsdp", ("data", "fsdp")), x.sharding


def test_sampled_as_applies_the_runs_rollout_flags():
  """The one place a run's sampler config is made (Context.sampled_as and
  the planner's rollout programs both call it): --rollout_dtype ('' keeps
  the model's), --decode_attention ("auto" is dense on CPU) and
  --rollout_layout; the architecture otherwise untouched."""
  from rlreason import config as config_lib

  base = config_lib.BaseConfig()
  got = rollout_layout.sampled_as(base, CFG)
  assert (got.dtype, got.decode_attention, got.rollout_layout) == (
    CFG.dtype,
    "dense",
    "auto",
  )
  run = dataclasses.replace(
    base,
    rollout_dtype="bfloat16",
    decode_attention="ragged",
    rollout_layout="fsdp",
    rollout_tensor=4,
  )
  got = rollout_layout.sampled_as(run, CFG)
  assert (
    got.dtype,
    got.decode_attention,
    got.rollout_layout,
    got.rollout_tensor,
  ) == ("bfloat16", "ragged", "fsdp", 4)
  assert (
    dataclasses.replace(
      got,
      dtype=CFG.dtype,
      decode_attention=CFG.decode_attention,
      rollout_layout=CFG.rollout_layout,
      rollout_tensor=CFG.rollout_tensor,
    )
    == CFG
  )


def _assert_same_rollout(a, b):
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.positions, b.positions)
  np.testing.assert_array_equal(a.mask, b.mask)
  np.testing.assert_allclose(a.logp, b.logp, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a.policy_logp, b.policy_logp, rtol=1e-5, atol=1e-6)
  assert a.texts == b.texts
  np.testing.assert_array_equal(a.lengths, b.lengths)


def test_chunked_calls_equal_one_call(params, ro, monkeypatch):
  """N = 8 rows in sampler calls of 3 (3 + 3 + 2 padded to 3) == one call:
  each row draws with its global row key. All calls share one program.
  `interrupt` is called between the calls (twice) and does not change the
  samples; one that raises stops the rollout there."""
  before = sampling.cache_size()
  checks = []
  chunked = _generate(
    params, step=3, rows_per_call=3, interrupt=lambda: checks.append(1)
  )
  # One program at most (another test of this process may have made it).
  assert sampling.cache_size() <= before + 1
  _assert_same_rollout(chunked, ro)
  assert len(checks) == 2

  class Stop(BaseException):
    pass

  def stop():
    raise Stop

  calls = testing.spy(monkeypatch, rollout, "_sample_rows", lambda *a, **k: 1)
  with pytest.raises(Stop):
    _generate(params, step=3, rows_per_call=3, interrupt=stop)
  assert calls == [1]


def test_chunked_sharded_calls_from_free_memory(params, ro, monkeypatch):
  """rows_per_call=0 on a mesh sizes calls from the devices' free memory:
  room for one sequence per device gives calls of 4 rows (the batch splits
  over data x fsdp = 4), with the samples of one call."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  testing.room_for(monkeypatch, CFG, 8, T, 1.5, tensor=2)
  calls = testing.spy(
    monkeypatch, rollout, "_sample_rows", lambda *a, **k: (len(a[1]), k["rows"])
  )
  chunked = _generate(params, step=3, mesh=mesh)
  assert calls == [(4, 4), (4, 4)]
  _assert_same_rollout(chunked, ro)


def test_continuous_batching_equals_one_static_call(params, ro, monkeypatch):
  """batching="continuous": the 8 rows run through 3 decode slots in one
  continuous call, on one device and on a mesh sized from free memory
  (one sequence per device: 4 slots), with the samples of one static call."""
  calls = []
  real = rollout._sample_rows
  monkeypatch.setattr(
    rollout,
    "_sample_rows",
    lambda *a, **k: calls.append(k.get("slots")) or real(*a, **k),
  )
  _assert_same_rollout(
    _generate(params, step=3, rows_per_call=3, batching="continuous"), ro
  )
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  testing.room_for(monkeypatch, CFG, 8, T, 1.5, tensor=2)
  sharded = _generate(params, step=3, mesh=mesh, batching="continuous")
  _assert_same_rollout(sharded, ro)
  assert calls == [3, 4]
  # More rows at once than the estimate says that memory holds (4), but
  # within what it holds were the estimate ESTIMATE_OVERCOUNT times too
  # high (3.75 sequences per device: 12): taken with a warning, the same
  # samples; more: an error before sampling.
  warned = testing.spy(
    monkeypatch, rollout_memory.logging, "log_first_n", lambda *a: a[1]
  )
  _assert_same_rollout(
    _generate(params, step=3, mesh=mesh, rows_per_call=8), ro
  )
  assert len(warned) == 1
  with pytest.raises(
    ValueError, match="--rollout_rows=13: .* holds 4 .* at most 12 were it 2.5x"
  ):
    _generate(params, step=3, mesh=mesh, rows_per_call=13)


def test_compiler_options_reach_the_samplers_compile(params, ro):
  """The path of --rollout_temp_budget_mib (libtpu's option, planned in
  tests/plan/plan_test.py): generate's compiler_options compile the static
  and the continuous sampler with them. An option XLA:CPU does not know
  fails that compile; a known one at its default gives the same samples."""
  for kw in ({}, {"rows_per_call": 3, "batching": "continuous"}):
    with pytest.raises(jax.errors.JaxRuntimeError, match="not_an_xla_option"):
      _generate(params, step=3, compiler_options={"not_an_xla_option": 1}, **kw)
    same = _generate(
      params, step=3, compiler_options={"xla_cpu_enable_fast_math": False}, **kw
    )
    _assert_same_rollout(same, ro)


def test_rows_per_call_by_hand():
  """The per-sequence estimate (hand-computed for a toy config) and the
  rows a call holds."""
  cfg = transformer.ModelConfig(
    vocab_size=10,
    d_model=4,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    head_dim=2,
    mlp_dim=8,
    attention_block=2,
  )
  # cache 2*2*1*2*(3+5)*4 = 256; prefill 4*3*(24+24) = 576 plus
  # 4*2*2*3*2 = 96; decode 16*10 + 16*5 = 240.
  assert rollout_memory.sequence_bytes(cfg, 3, 5) == 256 + 576 + 96 + 240
  per = 1168
  frac = rollout_memory.ROLLOUT_FREE_FRACTION
  assert (
    rollout_memory.rows_per_call(cfg, 3, 5, int(2 * per / frac) + 1, 4) == 8
  )
  assert (
    rollout_memory.rows_per_call(cfg, 3, 5, 10, 4) == 4
  )  # at least 1 per shard
  # Continuous batching: per slot two cache copies and the decode buffers
  # (2 * 256 + 240 = 752); the prefill working set (576 + 96) and twice
  # the prompt's cache (2*2*1*2*3*4 = 96 each) for the device's own
  # refill rows (4 rows over the 4 shards: 1); a copy of the MLP weights
  # (3*4*8*2 layers*4 = 768). 3 slots per shard: 3 * 752 + 864 + 768.
  assert rollout_memory.mlp_copy_bytes(cfg) == 768
  assert rollout_memory.continuous_bytes(cfg, 3, 5, 12, 4) == 3888
  # Slots the shards do not split: all 4 refill rows on every device.
  assert (
    rollout_memory.continuous_bytes(cfg, 3, 5, 10, 4) == 3 * 752 + 4 * 864 + 768
  )
  # A call's bytes (call_bytes): static, 10 rows over 4 shards hold 3 per
  # device; continuous, the slots' continuous_bytes.
  assert rollout_memory.call_bytes(cfg, 3, 5, 10, 4) == 3 * 1168
  assert rollout_memory.call_bytes(cfg, 3, 5, 12, 4, "continuous") == 3888
  free = 5580  # 0.8 * 5580 = 4464
  assert rollout_memory.rows_per_call(cfg, 3, 5, free, 4) == 12
  assert rollout_memory.rows_per_call(cfg, 3, 5, free, 4, "continuous") == 12
  # 8 slots per shard (8 * 752 + 1632 = 7648) fit 0.8 * 10000 = 8000, 9
  # do not: more than the 6 static rows of 1168 bytes, whose prefills all
  # run at once.
  assert rollout_memory.rows_per_call(cfg, 3, 5, 10000, 4) == 24
  assert rollout_memory.rows_per_call(cfg, 3, 5, 10000, 4, "continuous") == 32
  # Over a tensor axis of 2: MLP products 4*3*(24+12) = 432, one head's
  # scores 48, half the vocabulary's logits 16*5 + 80; the one KV head
  # does not split (256), two do (2*2*2*2*8*4 / 2 = 256 of 512).
  assert rollout_memory.sequence_bytes(cfg, 3, 5, 2) == 256 + 432 + 48 + 160
  kv2 = dataclasses.replace(cfg, n_kv_heads=2)
  assert rollout_memory.cache_bytes(kv2, 8) == 512
  assert rollout_memory.sequence_bytes(kv2, 3, 5, 2) == 256 + 432 + 48 + 160
  # So a call holds more rows per device: room for 3 rows of 896 bytes
  # (split) is room for one of 1424 (unsplit), per shard.
  free = int(3 * 896 / frac) + 1
  assert rollout_memory.rows_per_call(kv2, 3, 5, free, 4, tensor=2) == 12
  assert rollout_memory.rows_per_call(kv2, 3, 5, free, 4) == 4
  # Continuous: 3 slots of 2 * 256 + 160, one refill row's 432 + 48 +
  # 2 * 96, half the MLP weights' copy (384).
  assert (
    rollout_memory.continuous_bytes(kv2, 3, 5, 12, 4, 2)
    == 3 * (512 + 160) + (480 + 192) + 384
  )


def test_stop_strings_as_token_sequences(params, ro):
  """A 2-character stop string (2 tokens) ends a completion right after it;
  the samples before it are those of the run without it (same rng).
  Compared in tokens: a random model also emits ids that decode to nothing,
  so a text can show the string without the tokens holding it."""
  p = ro.prompt_len
  # Two printable tokens after a completion's first: the stop ends it at 3.
  i, pair = next(
    (r, pair)
    for r in range(len(ro.lengths))
    if ro.lengths[r] >= 4
    for pair in [tuple(int(t) for t in ro.tokens[r, p + 1 : p + 3])]
    if len(TOK.decode(list(pair))) == 2
  )
  stop = TOK.decode(list(pair))
  seqs = stops.token_sequences(TOK, [stop])
  assert seqs == (pair,)
  cut = _generate(params, step=3, extra_stop_sequences=seqs)
  for r in range(len(ro.lengths)):
    old = [int(t) for t in ro.tokens[r, p : p + ro.lengths[r]]]
    ends = [t + 2 for t in range(len(old) - 1) if tuple(old[t : t + 2]) == pair]
    n = ends[0] if ends else len(old)
    assert cut.lengths[r] == n
    np.testing.assert_array_equal(cut.tokens[r, p : p + n], old[:n])
    want = "eos" if ends else ro.finish_reasons[r]
    assert cut.finish_reasons[r] == want
  assert cut.lengths[i] == 3
  np.testing.assert_array_equal(np.asarray(cut.mask).sum(-1), cut.lengths)


@pytest.mark.parametrize(
  "texts,kwargs,match",
  [
    (TEXTS, dict(max_prompt_len=4), "more than the prompt budget"),
    (["1+1=", ""], {}, "empty"),
    (TEXTS, dict(extra_stop_ids=(CFG.vocab_size,)), "outside the model"),
    (
      TEXTS,
      dict(extra_stop_sequences=((5, CFG.vocab_size),)),
      "outside the model",
    ),
    (TEXTS, dict(group_size=0), "group_size"),
    (TEXTS, dict(batching="dynamic"), "batching='dynamic'"),
  ],
)
def test_bad_input_fails_before_compiling(params, texts, kwargs, match):
  before = sampling.cache_size()
  with pytest.raises(ValueError, match=match):
    _generate(params, texts=texts, **kwargs)
  assert sampling.cache_size() == before


def test_tensor_parallel_decode_gathers_logits_not_the_unembedding(params):
  """With the vocab split over tensor (--mesh_tensor=2), a decode step's
  logits come from each device's own unembedding shard and are gathered
  ([rows, V], small), not the [D, V] weights (each step, before
  engine.batch_logits: 1 GiB at a 7B vocab, the planner's ICI showed)."""
  mesh = mesh_lib.make_mesh(data=1, fsdp=4, tensor=2)
  laid, _ = rollout_layout.on_mesh(params, jax.random.key(0), mesh, CFG)
  n = 8
  tokens = jnp.zeros((n, 1), jnp.int32)
  cache = transformer.init_cache(CFG, n, 16)
  step = jax.jit(lambda p, t, c: engine.last_logits(p, t, t, c, CFG, mesh))
  text = step.lower(laid, tokens, cache).compile().as_text()
  gathered = re.findall(r"= \w+\[([\d,]*)\]\S* all-gather\(", text)
  sizes = [np.prod([int(d) for d in g.split(",") if d]) for g in gathered]
  assert sizes, "no all-gather: the logits are not gathered over vocab"
  assert max(sizes) < CFG.d_model * CFG.vocab_size, gathered
  logits, _ = step(laid, tokens, cache)
  want, _ = engine.last_logits(params, tokens, tokens, cache, CFG, None)
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
