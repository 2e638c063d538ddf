"""Sampler invariants: cached decode == full forward, log-probs, EOS, filters.

Every sampler call here shares a few static configurations, so the module
compiles the sampler only a handful of times.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rlreason.model import policy
from rlreason.sampling import sampler as sampling
from rlreason.sampling import draw
from rlreason.sampling import engine
from rlreason.sampling import vocab_scan
from rlreason import testing
from rlreason.model import transformer
from rlreason.sampling.draw import Sampling

CFG = testing.tiny_model_config(qkv_bias=True)
PAD = 0
STOP = (3, 4, 5, 6, 7, 8)  # several stop ids, so that some rows stop early
T = 10
LENGTHS = (8, 3, 5, 1, 8, 6)  # ragged prompts, left padded to P = 8
TEMPERATURE = 0.7


# The module's sampler settings (the `sampled` fixture's).
_KW = dict(
  model_cfg=CFG,
  max_new_tokens=T,
  sampling=Sampling(TEMPERATURE),
  stop_ids=STOP,
  pad_id=PAD,
)


@pytest.fixture(scope="module")
def params():
  params = transformer.init(CFG, jax.random.key(0))
  # Sharper next-token distributions, so that the filters cut something.
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8
  return params


def _prompts(lengths=LENGTHS, seed=0):
  """Left-padded prompts [N, P] and positions, as numpy arrays."""
  return testing.left_padded_prompts(lengths, CFG.vocab_size, PAD, seed)


def _sample(
  params,
  tokens,
  positions,
  rng,
  sampling_=None,
  max_new_tokens=T,
  return_logits=True,
):
  return sampling.sample(
    params,
    jnp.asarray(tokens),
    jnp.asarray(positions),
    rng,
    model_cfg=CFG,
    max_new_tokens=max_new_tokens,
    sampling=sampling_ or Sampling(TEMPERATURE),
    stop_ids=STOP,
    pad_id=PAD,
    return_logits=return_logits,
  )


def _full_sequence(tokens, positions, out):
  """Prompt + completion [N, P + T] with positions (-1 after the stop)."""
  start = positions[:, -1:] + 1
  comp_pos = np.where(np.asarray(out.mask) > 0, start + np.arange(T)[None], -1)
  return (
    jnp.concatenate([tokens, out.tokens], 1),
    jnp.asarray(np.concatenate([positions, comp_pos], 1), jnp.int32),
  )


@pytest.fixture(scope="module")
def sampled(params):
  tokens, positions = _prompts()
  out = _sample(params, tokens, positions, jax.random.key(1))
  full_tokens, full_positions = _full_sequence(tokens, positions, out)
  full_logits = policy.logits(
    params, full_tokens, CFG, positions=full_positions
  )
  return tokens, positions, out, full_tokens, full_positions, full_logits


def test_outcomes_cover_eos_and_length(sampled):
  *_, out, _, _, _ = sampled
  finish = np.asarray(out.finish)
  assert (finish == sampling.FINISH_EOS).any()
  assert (finish == sampling.FINISH_LENGTH).any()


def test_cached_decode_equals_full_forward(sampled):
  """Logits at every decoded position == the full forward, ragged prompts."""
  tokens, _, out, _, _, full_logits = sampled
  p = tokens.shape[1]
  want = np.asarray(full_logits[:, p - 1 : p - 1 + T])  # predicts token t
  got = np.asarray(out.logits)
  mask = np.asarray(out.mask, bool)
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-5)


def test_recorded_logp_equal_recomputed(params, sampled):
  tokens, _, out, full_tokens, full_positions, _ = sampled
  p = tokens.shape[1]
  mask = np.asarray(out.mask, bool)
  tempered = policy.completion_logprobs(
    params, full_tokens, full_positions, CFG, p, temperature=TEMPERATURE
  )
  untempered = policy.completion_logprobs(
    params, full_tokens, full_positions, CFG, p
  )
  np.testing.assert_allclose(
    np.asarray(out.logp)[mask], np.asarray(tempered)[mask], rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(out.policy_logp)[mask],
    np.asarray(untempered)[mask],
    rtol=1e-5,
    atol=1e-5,
  )


def test_nothing_after_eos(sampled):
  *_, out, _, _, _ = sampled
  tokens = np.asarray(out.tokens)
  mask = np.asarray(out.mask)
  lengths = np.asarray(out.lengths)
  finish = np.asarray(out.finish)
  np.testing.assert_array_equal(mask.sum(-1), lengths)
  for row, m, n, f in zip(tokens, mask, lengths, finish, strict=True):
    np.testing.assert_array_equal(m, np.arange(T) < n)  # 1..1 0..0
    stops = np.isin(row[:n], STOP)
    if f == sampling.FINISH_EOS:
      assert stops[-1] and not stops[:-1].any()  # stops at its first stop id
    else:
      assert n == T and not stops.any()
    assert (row[n:] == PAD).all()
  assert (np.asarray(out.logp)[mask == 0] == 0).all()
  assert (np.asarray(out.policy_logp)[mask == 0] == 0).all()


def test_greedy_is_deterministic_argmax_of_full_forward(params):
  tokens, positions = _prompts(seed=1)
  greedy = Sampling(temperature=0.0)
  a = _sample(params, tokens, positions, jax.random.key(0), greedy)
  b = _sample(params, tokens, positions, jax.random.key(7), greedy)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  full_tokens, full_positions = _full_sequence(tokens, positions, a)
  full = policy.logits(params, full_tokens, CFG, positions=full_positions)
  p = tokens.shape[1]
  want = np.argmax(np.asarray(full[:, p - 1 : p - 1 + T]), axis=-1)
  mask = np.asarray(a.mask, bool)
  np.testing.assert_array_equal(np.asarray(a.tokens)[mask], want[mask])
  assert (np.asarray(a.logp) == 0).all()  # a point mass


def test_bf16_decode_of_fp32_weights_matches_full_forward(params):
  """The sampler casts fp32 weights to the bf16 compute dtype once, up front;
  its logits stay those of the bf16 full forward (bf16 tolerance)."""
  cfg = dataclasses.replace(CFG, dtype="bfloat16")
  tokens, positions = _prompts(seed=2)
  out = sampling.sample(
    params,
    jnp.asarray(tokens),
    jnp.asarray(positions),
    jax.random.key(3),
    model_cfg=cfg,
    max_new_tokens=T,
    sampling=Sampling(TEMPERATURE),
    stop_ids=STOP,
    pad_id=PAD,
    return_logits=True,
  )
  full_tokens, full_positions = _full_sequence(tokens, positions, out)
  full = policy.logits(params, full_tokens, cfg, positions=full_positions)
  p = tokens.shape[1]
  want = np.asarray(full[:, p - 1 : p - 1 + T], np.float32)
  got = np.asarray(out.logits, np.float32)
  mask = np.asarray(out.mask, bool)
  scale = np.abs(want[mask]).max()
  assert np.abs(got[mask] - want[mask]).max() <= 0.05 * scale


def test_same_shapes_do_not_recompile(params, sampled):
  tokens, positions, first, *_ = sampled
  before = sampling.cache_size()
  other_tokens, other_positions = _prompts(seed=5)  # same shapes
  out = _sample(params, other_tokens, other_positions, jax.random.key(2))
  again = _sample(params, tokens, positions, jax.random.key(1))
  assert sampling.cache_size() == before
  np.testing.assert_array_equal(again.tokens, first.tokens)  # same rng
  assert not np.array_equal(out.tokens, first.tokens)


def test_rows_sampled_in_chunks_equal_one_call(params, sampled):
  """Row i draws with fold_in(rng, row_offset + i): chunks of the batch,
  each with the index of its first row, reproduce the whole call's samples
  (how evaluation.sample_and_score stays independent of its chunk size);
  without the offsets the second chunk reuses rows 0.. 's keys."""
  tokens, positions, first, *_ = sampled
  rng = jax.random.key(1)
  kw = _KW
  parts = [
    sampling.sample(
      params, tokens[lo:hi], positions[lo:hi], rng, **kw, row_offset=lo
    )
    for lo, hi in ((0, 2), (2, 6))
  ]
  for name in ("tokens", "lengths"):
    np.testing.assert_array_equal(
      np.concatenate([getattr(o, name) for o in parts]), getattr(first, name)
    )
  np.testing.assert_allclose(
    np.concatenate([o.logp for o in parts]), first.logp, rtol=1e-5, atol=1e-5
  )
  same_keys = sampling.sample(
    params, tokens[2:4], positions[2:4], rng, **kw, row_offset=0
  )
  assert not np.array_equal(same_keys.tokens, parts[1].tokens[:2])


def test_progress_reports_rows_stopped_from_inside_the_loop(
  params, sampled, monkeypatch
):
  """With a progress callback the compiled loop reports, each time it has
  drawn another PROGRESS_STEPS (3) tokens and rows are left, how many rows
  have stopped; the samples and logits are the ones drawn without it.
  Where T is no more than PROGRESS_STEPS, the program without reports."""
  tokens, positions, first, *_ = sampled
  monkeypatch.setattr(engine, "PROGRESS_STEPS", 3)
  reports = []
  kw = dict(_KW, return_logits=True)
  out = sampling.sample(
    params, tokens, positions, jax.random.key(1), **kw,
    progress=reports.append,
  )  # fmt: skip
  for name in ("tokens", "mask", "lengths", "finish"):
    np.testing.assert_array_equal(getattr(out, name), getattr(first, name))
  for name in ("logp", "policy_logp", "logits"):
    np.testing.assert_allclose(
      getattr(out, name), getattr(first, name), rtol=1e-6, atol=1e-6
    )
  stopped = np.asarray(first.finish) == sampling.FINISH_EOS
  lengths = np.asarray(first.lengths)
  want = []
  for drawn in range(3, T, 3):  # tokens drawn at each report
    rows = stopped & (lengths <= drawn)
    if not rows.all():
      want.append(int(rows.sum()))
  assert reports == want and len(want) >= 2, (reports, want)
  monkeypatch.setattr(engine, "PROGRESS_STEPS", T)
  quiet = sampling.sample(params, tokens, positions, jax.random.key(1), **kw)
  before = sampling.cache_size()
  again = sampling.sample(
    params, tokens, positions, jax.random.key(1), **kw,
    progress=reports.append,
  )  # fmt: skip
  assert sampling.cache_size() == before and len(reports) == len(want)
  np.testing.assert_array_equal(again.tokens, quiet.tokens)
  # Nor on a GPU, whose lax.cond would read its predicate every step.
  monkeypatch.setattr(engine.jax, "default_backend", lambda: "gpu")
  assert engine.progress_every(reports.append) == 0


# --- Stop sequences -----------------------------------------------------------


def _first_stop(row, ids=(), seqs=()):
  """Reference: the first t at which row[: t + 1] ends with a stop."""
  for t in range(len(row)):
    if row[t] in ids:
      return t
    for s in seqs:
      if t + 1 >= len(s) and tuple(row[t + 1 - len(s) : t + 1]) == s:
        return t
  return None


def test_stop_sequences_end_rows_after_their_last_token(params):
  tokens, positions = _prompts(seed=3)
  kw = dict(
    model_cfg=CFG,
    max_new_tokens=T,
    sampling=Sampling(TEMPERATURE),
    pad_id=PAD,
  )
  rng = jax.random.key(4)
  # Without stops; row i's step t draws with fold_in(row key i, t) whatever
  # the stops, so a run with stops reproduces these tokens up to its stop.
  free = sampling.sample(params, tokens, positions, rng, **kw)
  g = np.asarray(free.tokens)
  assert (np.asarray(free.lengths) == T).all()
  seqs = (
    tuple(int(i) for i in g[0, 2:5]),  # 3 tokens, ends at column 4 of row 0
    tuple(int(i) for i in g[1, 1:3]),  # 2 tokens, ends at column 2 of row 1
    # Last prompt token + first completion token: emitted tokens only
    # count, so this never ends a row at column 0.
    (int(tokens[2, -1]), int(g[2, 0])),
  )
  out = sampling.sample(
    params, tokens, positions, rng, stop_sequences=seqs, **kw
  )
  before = sampling.cache_size()
  sampling.sample(
    params, tokens, positions, jax.random.key(9), stop_sequences=seqs, **kw
  )
  assert sampling.cache_size() == before
  want_len = []
  for row in g:
    t = _first_stop([int(i) for i in row], seqs=seqs)
    want_len.append(T if t is None else t + 1)
  want_len = np.array(want_len)
  assert want_len[0] <= 5 and want_len[1] <= 3
  assert (want_len == T).any(), "no row runs to the length limit"
  np.testing.assert_array_equal(out.lengths, want_len)
  np.testing.assert_array_equal(
    out.finish,
    np.where(want_len < T, sampling.FINISH_EOS, sampling.FINISH_LENGTH),
  )
  cols = np.arange(T)[None, :]
  mask = cols < want_len[:, None]
  np.testing.assert_array_equal(out.mask, mask.astype(np.int32))
  np.testing.assert_array_equal(np.where(mask, g, PAD), out.tokens)
  np.testing.assert_allclose(
    np.asarray(out.logp), np.where(mask, free.logp, 0.0), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(out.policy_logp),
    np.where(mask, free.policy_logp, 0.0),
    rtol=1e-5,
    atol=1e-5,
  )


def test_single_token_stop_sequences_take_the_stop_id_path(params, sampled):
  """Length-1 sequences fold into stop_ids: the very same compiled sampler
  (no new variant) and the same samples."""
  tokens, positions, first, *_ = sampled
  before = sampling.cache_size()
  again = sampling.sample(
    params,
    jnp.asarray(tokens),
    jnp.asarray(positions),
    jax.random.key(1),
    model_cfg=CFG,
    max_new_tokens=T,
    sampling=Sampling(TEMPERATURE),
    stop_ids=STOP[:3],
    stop_sequences=tuple((i,) for i in STOP[3:]),
    pad_id=PAD,
    return_logits=True,
  )
  assert sampling.cache_size() == before
  # Exact: the same compiled program (cache_size above) on the same inputs.
  np.testing.assert_array_equal(again.tokens, first.tokens)
  np.testing.assert_array_equal(again.logp, first.logp)


# --- The sampling distribution ------------------------------------------------


def _reference_probs(logits: np.ndarray, s: Sampling) -> np.ndarray:
  """softmax(logits / T) with top-k, then top-p, then min-p, in float64."""
  z = logits.astype(np.float64) / s.temperature
  keep = np.ones_like(z, bool)
  order = np.argsort(-z, kind="stable")
  if s.top_k:
    keep &= z >= z[order[s.top_k - 1]]
  if s.top_p < 1:
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    before = np.cumsum(p[order]) - p[order]
    keep[order[before >= s.top_p]] = False
  if s.min_p:
    keep &= z >= z.max() + np.log(s.min_p)
  p = np.where(keep, np.exp(z - z.max()), 0.0)
  return p / p.sum()


FILTERS = [
  Sampling(temperature=0.8, top_k=6),
  Sampling(temperature=1.0, top_p=0.6),  # bisection over the full vocab
  Sampling(temperature=1.3, top_k=20, top_p=0.8, min_p=0.2),
]


def test_filters_keep_the_reference_set():
  """sampling_logits keeps exactly the reference support, hand-made rows."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(16, 50)).astype(np.float32) * 2
  logits[0, :5] = 3.0  # ties at the top
  for s in FILTERS:
    got = np.asarray(jax.jit(s.sampling_logits)(jnp.asarray(logits)))
    for row, z in zip(logits, got, strict=True):
      want = _reference_probs(row, s)
      np.testing.assert_array_equal(np.isfinite(z), want > 0, err_msg=str(s))
      np.testing.assert_allclose(
        np.asarray(jax.nn.softmax(z)),
        want,
        rtol=1e-5,
        atol=1e-6,
        err_msg=str(s),
      )


def test_argmax_and_inverse_cdf_primitives():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(8, 300)).astype(np.float32)
  x[0, [7, 200]] = 9.0  # a tie: the first index wins, as jnp.argmax
  np.testing.assert_array_equal(jax.jit(vocab_scan.argmax)(x), np.argmax(x, -1))
  e = np.where(rng.random((8, 300)) < 0.05, rng.random((8, 300)), 0.0)
  e[:, 299] = 0.0
  e[0] = 0.0
  e[0, 0] = 1.0
  inverse_cdf = jax.jit(vocab_scan.inverse_cdf)
  for u in (0.0, 0.5, 1.0 - 2**-24):
    ids, total = inverse_cdf(
      jnp.asarray(e, jnp.float32), jnp.full((8,), u, jnp.float32)
    )
    assert (e[np.arange(8), np.asarray(ids)] > 0).all(), u
    np.testing.assert_allclose(total, e.sum(-1), rtol=1e-5, atol=1e-6)


def _check_counts(counts: np.ndarray, want: np.ndarray, n: int, s):
  """Filtered-out tokens never appear, every kept token with an expected
  count >= 20 appears, and a chi-square test passes (p > 1e-4)."""
  expected = want * n
  assert counts[want == 0].sum() == 0, np.flatnonzero(counts * (want == 0))
  assert (counts[expected >= 20] > 0).all()
  assert 3 <= (expected > 0).sum() < CFG.vocab_size // 2  # the filter cuts
  _, p_value = stats.chisquare(counts[expected > 0], expected[expected > 0])
  assert p_value > 1e-4, (s, p_value)


@pytest.fixture(scope="module")
def one_prompt(params):
  """A prompt and the full-forward logits [V] of its next token."""
  tokens, positions = _prompts(lengths=(6,), seed=3)
  logits = np.asarray(policy.logits(params, jnp.asarray(tokens), CFG))[0, -1]
  return tokens, positions, logits


def test_sampled_distribution_matches_filtered_softmax(params, one_prompt):
  """4096 one-token samples of one prompt through the whole sampler."""
  n, s = 4096, FILTERS[-1]
  tokens, positions, logits = one_prompt
  want = _reference_probs(logits, s)
  out = sampling.sample(
    params,
    jnp.asarray(np.repeat(tokens, n, 0)),
    jnp.asarray(np.repeat(positions, n, 0)),
    jax.random.key(42),
    model_cfg=CFG,
    max_new_tokens=1,
    sampling=s,
  )
  ids = np.asarray(out.tokens[:, 0])
  _check_counts(np.bincount(ids, minlength=CFG.vocab_size), want, n, s)
  # The recorded logp is the log of the filtered probability.
  np.testing.assert_allclose(
    np.asarray(out.logp[:, 0]), np.log(want[ids]), rtol=1e-5, atol=1e-4
  )


@pytest.mark.parametrize("s", FILTERS[:-1], ids=str)
def test_draw_distribution_matches_filtered_softmax(one_prompt, s):
  """The same check for more filters, drawing from the model's logits."""
  n = 4096
  logits = jnp.asarray(np.repeat(one_prompt[2][None], n, 0))
  keys = draw.row_keys(jax.random.key(42), n)
  ids, logp, _ = jax.jit(s.draw)(logits, keys)
  want = _reference_probs(one_prompt[2], s)
  _check_counts(
    np.bincount(np.asarray(ids), minlength=CFG.vocab_size), want, n, s
  )
  np.testing.assert_allclose(
    logp, np.log(want[np.asarray(ids)]), rtol=1e-5, atol=1e-4
  )


# --- Bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(min_p=1.0), "min_p"),
  ],
)
def test_bad_sampling_choices(kwargs, match):
  with pytest.raises(ValueError, match=match):
    Sampling(**kwargs)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(stop_ids=(CFG.vocab_size,)), "outside the vocabulary"),
    (dict(stop_ids=(-1,)), "outside the vocabulary"),
    (dict(stop_sequences=((5, CFG.vocab_size),)), "outside the vocabulary"),
    (dict(stop_sequences=((),)), "Empty stop sequence"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(pad_id=CFG.vocab_size), "pad_id"),
  ],
)
def test_bad_arguments_fail_before_compiling(params, kwargs, match):
  tokens, positions = _prompts()
  before = sampling.cache_size()
  args = dict(model_cfg=CFG, max_new_tokens=T, sampling=Sampling())
  with pytest.raises(ValueError, match=match):
    sampling.sample(
      params, tokens, positions, jax.random.key(0), **{**args, **kwargs}
    )
  assert sampling.cache_size() == before


def test_right_padded_or_mismatched_prompts_are_rejected(params):
  tokens, positions = _prompts()
  args = dict(model_cfg=CFG, max_new_tokens=T)
  with pytest.raises(ValueError, match="left padded"):
    sampling.sample(
      params, tokens[:, ::-1], positions[:, ::-1], jax.random.key(0), **args
    )
  with pytest.raises(ValueError, match=r"\[N, P\]"):
    sampling.sample(params, tokens, positions[:, 1:], jax.random.key(0), **args)
