"""Multi-turn rollouts: cache continuation, observation masking, returns."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.envs import multiturn
from rlreason.rl import objective
from rlreason.model import policy
from rlreason.rl import returns as returns_lib
from rlreason import testing
from rlreason.rl import turn_credit
from rlreason.data.sources import Example
from rlreason.envs import StepResult
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.sampling.draw import Sampling

CFG = testing.tiny_model_config()
TOK = tokenizer_lib.CharTokenizer()


class EchoEnv:
  """Observation `obs<k>\\n` after every turn; done after `turns` turns."""

  def __init__(self, turns):
    self.turns, self.k = turns, 0

  def reset(self, example):
    self.k = 0
    return ""

  def step(self, action):
    self.k += 1
    done = self.k >= self.turns
    obs = "" if done else f"obs{self.k}" + "!" * self.k + "\n"
    return StepResult(obs, float(self.k), done)


PROMPTS = ("Q: 1+2?\n", "Q: ab\n")


def _generate(params, turns=(1, 2, 3, 3), prompts=PROMPTS, **kw):
  """Episodes of EchoEnv(t) for t in `turns` (ragged episode lengths),
  G = 2 rows per prompt."""
  envs = [EchoEnv(t) for t in turns]
  for e in envs:
    e.reset(Example("u", "q", "a"))
  return multiturn.generate(
    params,
    [TOK.encode(p) for p in prompts],
    envs,
    jax.random.key(1),
    0,
    model_cfg=kw.pop("model_cfg", CFG),
    tokenizer=TOK,
    max_turns=3,
    turn_tokens=6,
    obs_tokens=8,
    group_size=2,
    turn_stop_ids=TOK.encode("\n"),
    bucket=1,
    **kw,
  )


@pytest.fixture(scope="module")
def rollout():
  params = transformer.init(CFG, jax.random.key(0))
  return params, _generate(params)


def _assert_same_episodes(a, b):
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(a.num_turns, b.num_turns)
  np.testing.assert_array_equal(a.turn_rewards, b.turn_rewards)
  np.testing.assert_array_equal(a.finish_reasons, b.finish_reasons)
  assert a.texts == b.texts and a.observations == b.observations
  for name in ("logp", "policy_logp"):
    np.testing.assert_allclose(
      np.asarray(getattr(a, name)),
      np.asarray(getattr(b, name)),
      rtol=1e-5,
      atol=1e-5,
    )


def test_shapes_and_turns(rollout):
  _, ro = rollout
  t = 3 * 6 + 2 * 8
  assert multiturn.completion_budget(3, 6, 8) == t
  assert ro.mask.shape == (4, t) and ro.tokens.shape[1] == ro.prompt_len + t
  np.testing.assert_array_equal(ro.num_turns, [1, 2, 3, 3])
  np.testing.assert_array_equal(ro.turn_rewards[1], [1, 2, 0])
  # Observation tokens sit in the sequence, with mask 0.
  obs = ro.segment == multiturn.OBSERVATION
  assert obs[2].sum() == len("obs1!\n") + len("obs2!!\n")
  assert not np.asarray(ro.mask)[obs].any()
  assert "obs1!\n" in ro.texts[2] and "obs2!!\n" in ro.texts[2]
  np.testing.assert_array_equal(np.asarray(ro.mask).sum(-1), ro.lengths)


def test_cached_multiturn_logp_equals_full_forward(rollout):
  # The cache after prefill + turns + appended observations gives the same
  # log-probs as one forward over the compacted sequence.
  params, ro = rollout
  full = policy.completion_logprobs(
    params, ro.tokens, ro.positions, CFG, ro.prompt_len
  )
  m = np.asarray(ro.mask) > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(ro.policy_logp)[m], rtol=1e-5, atol=1e-4
  )


def test_observation_tokens_get_exactly_zero_gradient(rollout):
  params, ro = rollout
  cfg = objective.PGConfig(group_size=2)
  mask = np.asarray(ro.mask, np.float32)
  logp = jnp.asarray(ro.logp)
  # Advantages deliberately non-zero on observation tokens too.
  adv = jnp.ones_like(logp) * 0.7
  batch = {
    "tokens": ro.tokens,
    "positions": ro.positions,
    "mask": jnp.asarray(mask),
    "old_logp": logp,
    "adv": adv,
  }

  def loss(lp):
    return objective.pg_loss(
      params,
      batch,
      {},
      cfg=cfg,
      model_cfg=CFG,
      forward=(lp, jnp.zeros_like(lp)),
    )[0]

  g = np.asarray(jax.grad(loss)(logp))
  obs = ro.segment == multiturn.OBSERVATION
  assert obs.any()
  assert (g[obs] == 0).all()
  assert (g[mask > 0] != 0).all()


def test_turn_token_rewards_and_returns_across_observations():
  # One row: action tokens at columns 0-1 (turn 0), observation 2-3,
  # action 4-5 (turn 1), padding 6.
  mask = jnp.array([[1, 1, 0, 0, 1, 1, 0]], jnp.float32)
  turn_end = np.array([[1, 5]])
  r = turn_credit.turn_token_rewards(np.array([[0.5, 1.0]]), turn_end, 7)
  np.testing.assert_array_equal(r, [[0, 0.5, 0, 0, 0, 1.0, 0]])
  # REINFORCE++ returns, gamma 0.9: G5 = 1, G4 = .9, G1 = .5 + .81 = 1.31,
  # G0 = .9 * 1.31 (observations carry the return, do not discount it).
  g = returns_lib._discounted_returns(jnp.asarray(r), mask, 0.9)
  np.testing.assert_allclose(
    np.asarray(g)[0, [0, 1, 4, 5]],
    [1.179, 1.31, 0.9, 1.0],
    rtol=1e-6,
    atol=1e-6,
  )
  adv = returns_lib.reinforce_plus_plus(
    jnp.zeros(1), mask, token_rewards=jnp.asarray(r), gamma=0.9
  )
  x = np.array([1.179, 1.31, 0.9, 1.0])
  want = (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(
    np.asarray(adv)[0, [0, 1, 4, 5]], want, rtol=1e-5, atol=1e-5
  )
  assert (np.asarray(adv)[0, [2, 3, 6]] == 0).all()
  # GAE, gamma .9, lam .8, values V = [.1, .2, x, x, .3, .4]: the value after
  # column 1 is V4 (the observation is skipped).
  v = jnp.array([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 9.0]])
  a, ret = returns_lib.gae(
    jnp.asarray(r), v, mask, gamma=0.9, lam=0.8, whiten_advantages=False
  )
  d5 = 1.0 - 0.4
  d4 = 0.9 * 0.4 - 0.3
  a5, a4 = d5, d4 + 0.72 * d5
  d1 = 0.5 + 0.9 * 0.3 - 0.2
  a1 = d1 + 0.72 * a4
  d0 = 0.9 * 0.2 - 0.1
  a0 = d0 + 0.72 * a1
  np.testing.assert_allclose(
    np.asarray(a)[0], [a0, a1, 0, 0, a4, a5, 0], rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    np.asarray(ret)[0],
    [a0 + 0.1, a1 + 0.2, 0, 0, a4 + 0.3, a5 + 0.4, 0],
    rtol=1e-6,
    atol=1e-6,
  )


def test_information_gain_and_turn_advantages_hand_computed():
  probs = np.array([[0.1, 0.4, 0.0], [0.2, 0.0, 0.0]], np.float32)
  r = turn_credit.information_gain_rewards(
    probs, np.array([1.0, 0.0]), np.array([2, 1])
  )
  np.testing.assert_allclose(
    r, [[0.3, 1.0, 0], [0.0, 0, 0]], rtol=1e-6, atol=1e-6
  )
  adv = turn_credit.turn_advantages(r, np.array([2, 1]), 2, gamma=0.5)
  vals = np.array([0.3, 1.0, 0.0])  # the group's taken turns
  # Population variance 0.1756: std sqrt(0.1756 + 1e-8), plus eps 1e-6.
  z = (vals - vals.mean()) / (np.sqrt(vals.var() + 1e-8) + 1e-6)
  np.testing.assert_allclose(
    adv, [[z[0] + 0.5 * z[1], z[1], 0], [z[2], 0, 0]], rtol=1e-5, atol=1e-5
  )
  turn = np.array([[0, 0, 1, 1, -1], [0, 0, -1, -1, -1]])
  mask = np.array([[1, 0, 1, 1, 0], [1, 1, 0, 0, 0]])
  tok = turn_credit.spread_to_tokens(adv, turn, mask)
  np.testing.assert_allclose(
    tok,
    [[adv[0, 0], 0, adv[0, 1], adv[0, 1], 0], [adv[1, 0], adv[1, 0], 0, 0, 0]],
    rtol=1e-6,
    atol=1e-6,
  )


def test_separate_normalisation_leaves_equal_outcomes_at_zero():
  """IGPO's "separate" mode (the authors' later option): outcomes and
  information gains are normalised apart. Group 0 fails everywhere: its
  last turns get 0 (joint mode gives them the distance to the mean gain,
  below 0); group 1 has one success."""
  r = np.array(
    [[0.2, 0.1, 0.0], [0.4, 0.0, 0], [0.0, 0, 0]]
    + [[0.3, 1.0, 0], [0.5, 0.0, 0], [0.0, 0, 0]],
    np.float32,
  )
  turns = np.array([3, 2, 1, 2, 2, 1])
  adv = turn_credit.turn_advantages(r, turns, 3, norm_mode="separate")

  def z(v):
    v = np.asarray(v, np.float64)
    return (v - v.mean()) / (np.sqrt(v.var() + 1e-8) + 1e-6)

  g0, (o1, g1) = z([0.2, 0.1, 0.4]), (z([1.0, 0.0, 0.0]), z([0.3, 0.5]))
  want = [
    [g0[0] + g0[1], g0[1], 0],
    [g0[2], 0, 0],
    [0, 0, 0],
    [g1[0] + o1[0], o1[0], 0],
    [g1[1] + o1[1], o1[1], 0],
    [o1[2], 0, 0],
  ]
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
  joint = turn_credit.turn_advantages(r, turns, 3)
  assert joint[2, 0] < -0.5 and joint[0, 2] < -0.5  # failed answers pushed
  with pytest.raises(ValueError, match="norm_mode='x'"):
    turn_credit.turn_advantages(r, turns, 3, norm_mode="x")


def test_answer_prob_at_turn_zero_is_the_prompt_alone(rollout):
  params, ro = rollout
  answers = ["3", "3", "xy", "xy"]
  # Two of its 9 (prompt, turn) sequences per forward.
  score = functools.partial(
    policy.completion_logprobs_by_rows, params, model_cfg=CFG, rows=2
  )
  probs = turn_credit.answer_prob_at_turns(
    lambda t, p, n: score(t, p, prompt_len=n), ro, answers, tokenizer=TOK
  )
  assert (probs[ro.num_turns == 1, 1:] == 0).all()
  ids = TOK.encode("Q: 1+2?\n") + TOK.encode("answer: 3")
  lp = policy.completion_logprobs(
    params,
    np.asarray([ids]),
    np.arange(len(ids))[None],
    CFG,
    len(ids) - len("answer: 3"),
  )
  # Only the gold answer's token is scored; "answer: " is its context.
  np.testing.assert_allclose(
    probs[0, 0], np.exp(lp[0, -1]), rtol=1e-4, atol=1e-6
  )
  assert not np.isclose(probs[0, 0], np.exp(np.mean(lp)), rtol=1e-3, atol=0)


class _GreedyBPE:
  """Longest-match tokenizer over a fixed vocabulary: " Paris" is one
  token, so "answer: Paris" joins the format's space to the answer."""

  VOCAB = ["answer", ":", " ", " Paris", "<a>", "</a>", "P", "a", "r", "i", "s"]

  def encode(self, text):
    ids = []
    while text:
      tok = max((v for v in self.VOCAB if text.startswith(v)), key=len)
      ids.append(self.VOCAB.index(tok))
      text = text[len(tok) :]
    return ids


@pytest.mark.parametrize(
  "fmt, answer, want",
  [
    ("answer: {}", "Paris", [" Paris"]),  # the merged space is the answer's
    ("answer: {}", "Pairs", ["P", "a", "i", "r", "s"]),
    ("<a>{}</a>", "Paris", ["P", "a", "r", "i", "s"]),  # text after it too
    ("{}", "Paris", ["P", "a", "r", "i", "s"]),
    ("answer: {}", "", []),
  ],
)
def test_gold_span_is_the_tokens_that_cover_the_answer(fmt, answer, want):
  tok = _GreedyBPE()
  ids, (lo, hi) = turn_credit.gold_span(tok, fmt, answer)
  assert ids == tok.encode(fmt.format(answer))
  assert [tok.VOCAB[t] for t in ids[lo:hi]] == want


@pytest.mark.parametrize("rollout_tensor", [0, 4])
def test_sharded_rollout_matches_single_device(
  rollout, rollout_tensor, monkeypatch
):
  """8 devices: rows split over (data, fsdp) = 4 shards, heads over tensor
  = 2 (or, --rollout_tensor=4, decoded on the same devices as (2, 1, 4));
  same tokens, same log-probs, outputs split by rows on the run's mesh."""
  from rlreason import mesh as mesh_lib

  params, ro = rollout
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  assert mesh.devices.size == 8
  layout = multiturn.rollout_layout  # the meshes it lays the weights out on
  decoded_on = testing.spy(
    monkeypatch, layout, "on_mesh", lambda *a: dict(a[2].shape)
  )
  cfg = dataclasses.replace(CFG, rollout_tensor=rollout_tensor)
  sharded = _generate(params, mesh=mesh, model_cfg=cfg)
  _assert_same_episodes(sharded, ro)
  tensor = rollout_tensor or 2
  assert decoded_on == [{"data": 2, "fsdp": 8 // 2 // tensor, "tensor": tensor}]
  for name in ("tokens", "positions", "logp", "policy_logp", "mask"):
    x = getattr(sharded, name)
    assert x.sharding.spec[0] == ("data", "fsdp"), name
    assert x.sharding.mesh == mesh, name
    shapes = {sh.data.shape for sh in x.addressable_shards}
    assert shapes == {(1, x.shape[1])}, (name, shapes)


def test_episodes_in_calls_of_fewer_rows_equal_one_call(rollout):
  """4 rows in calls of 3 + 1, each with a cache of its own: each row
  draws with its batch index's key, so the episodes are those of one
  call."""
  params, ro = rollout
  _assert_same_episodes(_generate(params, rows_per_call=3), ro)


@pytest.mark.parametrize("rows_per_call", [0, 3])
def test_progress_counts_the_episodes_finished_after_each_turn(
  rollout, rows_per_call
):
  """After each turn that leaves episodes going, the episodes finished so
  far (earlier calls' rows included), and `interrupt` is called; the
  episodes do not change."""
  params, ro = rollout
  reports, checks = [], []
  out = _generate(
    params,
    rows_per_call=rows_per_call,
    progress=reports.append,
    interrupt=lambda: checks.append(reports[:]),
  )
  _assert_same_episodes(out, ro)
  assert checks == [reports[: i + 1] for i in range(len(reports))]  # after
  turns = np.asarray(ro.num_turns)
  want = []
  for lo in range(0, 4, rows_per_call or 4):
    part = turns[lo : lo + (rows_per_call or 4)]
    for k in range(1, 3):  # after turns 1 and 2 of 3
      if (part <= k).all():
        break
      want.append(lo + int((part <= k).sum()))
  assert reports == want and len(want) >= 2, (reports, want, turns)


def test_calls_are_sized_from_the_devices_free_memory(rollout, monkeypatch):
  """On a mesh whose devices hold 1.5 sequences each (rows split over
  data x fsdp = 4), 8 rows run in calls of 4, with the samples of one
  call on one device."""
  from rlreason import mesh as mesh_lib

  params, _ = rollout
  turns, prompts = (1, 2, 3, 3, 3, 1, 2, 2), PROMPTS + ("Q: c\n", "Q: 99\n")
  one = _generate(params, turns, prompts)
  p = max(len(TOK.encode(x)) for x in prompts)
  t = 3 * 6 + 2 * (8 + 1)  # the cache's slots past the prompt
  testing.room_for(monkeypatch, CFG, p, t, 1.5, tensor=2)
  calls = testing.spy(
    monkeypatch, multiturn, "_episodes", lambda *a, **k: (a[5], len(a[2]))
  )
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  _assert_same_episodes(_generate(params, turns, prompts, mesh=mesh), one)
  assert calls == [(0, 4), (4, 4)]


def test_segments_run_split_over_the_mesh():
  """extend / decode keep rows (and the cache) split over the batch axes."""
  from rlreason import mesh as mesh_lib
  from rlreason.sampling import segments

  params = transformer.init(CFG, jax.random.key(0))
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  params, _ = multiturn.rollout_layout.on_mesh(
    params, jax.random.key(0), mesh, CFG
  )
  tokens, positions = _prompt_rows(8)
  rows = mesh_lib.put_rows(mesh, (tokens, positions))
  assert rows[0].addressable_shards[0].data.shape == (2, tokens.shape[1])
  cache = segments.init_cache(CFG, 8, tokens.shape[1] + 6, mesh=mesh)
  logits, cache = segments.extend(
    params, cache, *rows, model_cfg=CFG, mesh=mesh
  )
  start, active = mesh_lib.put_rows(
    mesh, (positions[:, -1] + 1, np.ones(8, bool))
  )
  seg, cache = segments.decode(
    params,
    cache,
    logits,
    start,
    active,
    jax.random.key(2),
    model_cfg=CFG,
    max_new_tokens=6,
    sampling=Sampling(),
    stop_ids=(TOK.eos_id,),
    pad_id=TOK.pad_id,
    stop_sequences=((40, 41),),
    mesh=mesh,
  )
  for x in (logits, seg.tokens, seg.logp, seg.lengths, cache.pos):
    assert x.addressable_shards[0].data.shape[0] == 2  # 8 rows / 4 shards
  # k / v: [N, K, S, Dh], rows over (data, fsdp), kv heads over tensor.
  assert cache.k[0].addressable_shards[0].data.shape[:2] == (2, 1)


# --- Stop sequences and stop strings ------------------------------------------


def _prompt_rows(n):
  prompts = [TOK.encode(f"Q: {i}+{i}?\n"[: 5 + i % 4]) for i in range(n)]
  return multiturn.padding.pad_prompts(prompts, TOK.pad_id, bucket=1)


def test_segments_decode_stops_after_a_stop_sequence():
  from rlreason.sampling import segments

  params = transformer.init(CFG, jax.random.key(0))
  tokens, positions = _prompt_rows(4)
  cache = transformer.init_cache(CFG, 4, tokens.shape[1] + 8)
  logits, cache = segments.extend(
    params, cache, tokens, positions, model_cfg=CFG
  )
  kw = dict(
    model_cfg=CFG,
    max_new_tokens=8,
    sampling=Sampling(),
    stop_ids=(),
    pad_id=TOK.pad_id,
  )
  args = (
    params,
    cache,
    logits,
    jnp.asarray(positions[:, -1] + 1),
    jnp.ones(4, bool),
    jax.random.key(3),
  )
  free, _ = segments.decode(*args, **kw)
  g = np.asarray(free.tokens)
  assert (np.asarray(free.lengths) == 8).all()
  seqs = (tuple(int(i) for i in g[0, 1:4]), tuple(int(i) for i in g[2, 4:6]))
  seg, _ = segments.decode(*args, stop_sequences=seqs, **kw)
  want = []
  for row in g.tolist():
    ends = [
      t
      for t in range(8)
      for q in seqs
      if t + 1 >= len(q) and tuple(row[t + 1 - len(q) : t + 1]) == q
    ]
    want.append(min(ends) + 1 if ends else 8)
  want = np.array(want)
  assert want[0] <= 4 and want[2] <= 6 and (want == 8).any()
  np.testing.assert_array_equal(seg.lengths, want)
  np.testing.assert_array_equal(seg.stopped, want < 8)
  keep = np.arange(8)[None] < want[:, None]
  np.testing.assert_array_equal(seg.tokens, np.where(keep, g, TOK.pad_id))
  for name in ("logp", "policy_logp", "entropy"):
    np.testing.assert_allclose(
      np.asarray(getattr(seg, name)),
      np.where(keep, getattr(free, name), 0.0),
      rtol=1e-5,
      atol=1e-5,
    )


class TagEnv(EchoEnv):
  """EchoEnv whose turns end at a (multi-token) tag."""

  def __init__(self, turns, tag):
    super().__init__(turns)
    self.stop_strings = (tag,)
    self.seen = []

  def step(self, action):
    self.seen.append(action)
    return super().step(action)


def _run_tagged(params, make_env, tokenizer, stop_strings=None):
  """Two-turn episodes through make_generate_fn (the env's stop strings)."""
  import types

  envs = []

  def factory():
    envs.append(make_env())
    return envs[-1]

  examples = [Example("u", "Q: 1+2?\n", "3"), Example("v", "Q: ab\n", "x")]
  ctx = types.SimpleNamespace(
    tokenizer=tokenizer,
    model_cfg=CFG,
    segments_model_cfg=CFG,  # Context's: the run's rollout flags
    mesh=None,
    cfg=types.SimpleNamespace(max_prompt_len=None),
    encode_prompts=lambda ex: [tokenizer.encode(e.question) for e in ex],
  )
  fn = multiturn.make_generate_fn(
    factory,
    max_turns=2,
    turn_tokens=8,
    obs_tokens=8,
    stop_strings=stop_strings,
  )
  ro = fn(
    ctx, params, examples, jax.random.key(0), 0, group_size=2, sampling=None
  )
  return ro, envs


def _turn0(ro):
  """Each row's turn-0 action tokens and policy log-probs."""
  sel = (ro.turn == 0) & (ro.segment == multiturn.ACTION)
  comp = np.asarray(ro.tokens)[:, ro.prompt_len :]
  plp = np.asarray(ro.policy_logp)
  return [comp[i][sel[i]] for i in range(len(sel))], [
    plp[i][sel[i]] for i in range(len(sel))
  ]


def _assert_logp_is_full_forward(params, ro):
  full = policy.completion_logprobs(
    params, ro.tokens, ro.positions, CFG, ro.prompt_len
  )
  m = np.asarray(ro.mask) > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(ro.policy_logp)[m], rtol=1e-5, atol=1e-4
  )


def _fewest_with(tokenizer, ids, tag):
  """Reference: the fewest tokens whose text contains `tag` (else all)."""
  for m in range(1, len(ids) + 1):
    if tag in tokenizer.decode(list(ids[:m])):
      return m
  return len(ids)


@pytest.fixture(scope="module")
def free_turns():
  """Episodes without stops: the turn-0 actions every test below cuts."""
  params = transformer.init(CFG, jax.random.key(0))
  ro, _ = _run_tagged(params, lambda: TagEnv(2, "?"), TOK, stop_strings=())
  actions, plogp = _turn0(ro)
  assert all(len(a) == 8 for a in actions)
  return params, actions, plogp


def test_multi_token_tag_of_the_env_ends_a_turn(free_turns, monkeypatch):
  params, free, free_plogp = free_turns
  printable = lambda ids: all(3 <= i < 3 + len(TOK.ALPHABET) for i in ids)
  # A row whose tokens 1..3 are printable: they end its turn at 4 tokens.
  r = next(i for i, a in enumerate(free) if printable(a[1:4]))
  tag = TOK.decode(free[r][1:4].tolist())
  seq = TOK.encode(tag)
  assert len(seq) == 3
  # The in-loop token test alone (no host-side cut) must end the turns.
  monkeypatch.setattr(
    multiturn.stops, "kept_tokens", lambda tok, ids, s: len(ids)
  )
  ro, envs = _run_tagged(params, lambda: TagEnv(2, tag), TOK)
  actions, plogp = _turn0(ro)
  for i, a in enumerate(free):
    ends = [t for t in range(2, 8) if a[t - 2 : t + 1].tolist() == seq]
    m = ends[0] + 1 if ends else 8
    np.testing.assert_array_equal(actions[i], a[:m])
    np.testing.assert_allclose(
      plogp[i], free_plogp[i][:m], rtol=1e-5, atol=1e-5
    )
    assert envs[i].seen[0] == TOK.decode(a[:m].tolist())
    assert ro.turn_end[i, 0] == m - 1
  assert len(actions[r]) == 4 and ro.actions[r][0].endswith(tag)
  assert any(len(a) == 8 for a in actions)  # rows without the tag go on
  np.testing.assert_array_equal(ro.num_turns, [2, 2, 2, 2])
  _assert_logp_is_full_forward(params, ro)


class SplitTok(tokenizer_lib.CharTokenizer):
  """The char tokenizer, except that one otherwise silent id decodes to
  "@@": the model can write the stop string "@@" as that one token, which
  the token-sequence test (two "@" ids) does not catch."""

  def __init__(self, merged):
    super().__init__()
    self.merged = merged

  def decode(self, ids):
    return "".join(
      "@@" if i == self.merged else super(SplitTok, self).decode([i])
      for i in ids
    )


def test_stop_string_split_differently_is_cut_on_the_host(free_turns):
  params, free, free_plogp = free_turns
  # A row with a silent id among tokens 1..6: decoded as "@@", it ends
  # that row's turn right there.
  silent = lambda a: [j for j, i in enumerate(a) if i >= 3 + len(TOK.ALPHABET)]
  r = next(i for i, a in enumerate(free) if any(0 < j < 7 for j in silent(a)))
  first = min(j for j in silent(free[r]) if j > 0)
  tok = SplitTok(int(free[r][first]))
  assert tok.encode("@@") == [36, 36]
  ro, envs = _run_tagged(params, lambda: TagEnv(2, "@@"), tok)
  actions, plogp = _turn0(ro)
  for i, a in enumerate(free):
    m = _fewest_with(tok, a, "@@")
    np.testing.assert_array_equal(actions[i], a[:m])
    np.testing.assert_allclose(
      plogp[i], free_plogp[i][:m], rtol=1e-5, atol=1e-5
    )
    assert envs[i].seen[0] == tok.decode(a[:m].tolist())
  assert len(actions[r]) <= first + 1 < 8
  # The cut tokens were already in the cache: turn 1 must not see them.
  assert (ro.num_turns == 2).all()
  _assert_logp_is_full_forward(params, ro)
