"""The reward model's Bradley-Terry training (rewards/bradley_terry.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlreason import testing
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.rewards import bradley_terry as bt
from rlreason.rewards import model as rm

CFG = testing.tiny_model_config()
TOK = tokenizer_lib.CharTokenizer()


def test_bradley_terry_training_ranks_chosen_above_rejected():
  params = rm.init(CFG, jax.random.key(0))
  good = [f"answer: {i + 1}" for i in range(4)]
  bad = [f"answer: x{i}" for i in range(4)]

  def enc(texts):
    from rlreason.sampling import padding

    return padding.pad_prompts([TOK.encode(t) for t in texts], 0, bucket=1)

  chosen, rejected = enc(good), enc(bad)
  opt = optax.adam(1e-2)
  state = opt.init(params)
  loss_fn = lambda p: bt.bradley_terry_loss(p, chosen, rejected, CFG)

  @jax.jit
  def step(params, state):
    upd, state = opt.update(jax.grad(loss_fn)(params), state, params)
    return optax.apply_updates(params, upd), state

  first = float(loss_fn(params))
  for _ in range(30):
    params, state = step(params, state)
  assert float(loss_fn(params)) < first
  r = rm.score_texts(params, [""] * 8, good + bad, model_cfg=CFG, tokenizer=TOK)
  assert r[:4].min() > r[4:].max()


def test_bradley_terry_loss_is_one_forward_of_both_sides():
  """The loss scores chosen and rejected rows in one forward (the narrower
  side left-padded) and equals its definition, -mean log sigmoid(r(c) -
  r(r)), with each side scored on its own; gradients too."""
  params = rm.init(CFG, jax.random.key(0))
  params["head"]["w"] = jax.random.normal(jax.random.key(1), (CFG.d_model,))
  chosen, rejected = _pairs(
    ["1+1\nanswer: 2", "answer: 3"], ["answer: x", "2+2\nanswer: five"]
  )
  assert chosen[0].shape[1] != rejected[0].shape[1]

  def by_definition(p):
    rc, rr = rm.score(p, *chosen, CFG), rm.score(p, *rejected, CFG)
    return -jnp.mean(jax.nn.log_sigmoid(rc - rr))

  calls = []
  forward = rm.score

  def spy(p, tokens, positions, model_cfg):
    calls.append(tokens.shape)
    return forward(p, tokens, positions, model_cfg)

  rm.score = spy
  try:
    got, grads = jax.value_and_grad(bt.bradley_terry_loss)(
      params, chosen, rejected, CFG
    )
  finally:
    rm.score = forward
  width = max(chosen[0].shape[1], rejected[0].shape[1])
  assert calls == [(4, width)], calls
  want, want_grads = jax.value_and_grad(by_definition)(params)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # A shift of every reward leaves the loss as it is: the bias is not
  # trained (rounding noise, here, that Adam would scale to lr-sized steps).
  assert float(grads["head"]["b"]) == 0.0
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
    grads,
    want_grads,
  )


def test_preference_pairs_hand_made_groups():
  # G = 3: group 0 mixed (rows 0, 2 correct; row 1 wrong), group 1 all
  # wrong, group 2 one right (row 7) and two wrong (6, 8).
  correct = np.array([1, 0, 1, 0, 0, 0, 0, 1, 0])
  c, r = bt.preference_pairs(correct, 3, max_pairs=10)
  got = sorted(zip(c.tolist(), r.tolist()))
  assert got == [(0, 1), (2, 1), (7, 6), (7, 8)]
  c, r = bt.preference_pairs(correct, 3, max_pairs=1, seed=3)
  assert len(c) == 2 and set(c) <= {0, 2, 7}
  assert all(correct[c] == 1) and all(correct[r] == 0)
  assert (c // 3 == r // 3).all()  # same prompt
  c, r = bt.preference_pairs(np.zeros(6), 3, max_pairs=4)
  assert c.shape == r.shape == (0,)


def _pairs(good, bad):
  from rlreason.sampling import padding

  enc = lambda texts: padding.pad_prompts(
    [TOK.encode(t) for t in texts], 0, bucket=1
  )
  return enc(good), enc(bad)


def test_train_bt_first_loss_is_log2_and_learns_the_preference():
  # A zero head scores every sequence b = 0, so the first BT loss is
  # -log sigmoid(0) = log 2 and every pair is a tie (accuracy 1/2).
  params = rm.init(CFG, jax.random.key(0))
  good = [f"{i}+{i}\nanswer: {2 * i}" for i in range(8)]
  bad = [f"{i}+{i}\nanswer: x{i}" for i in range(8)]
  chosen, rejected = _pairs(good, bad)
  assert bt.pairwise_accuracy(params, chosen, rejected, CFG) == 0.5
  trained, losses = bt.train_bt(
    params, CFG, chosen, rejected, steps=40, batch_size=4, lr=3e-3
  )
  np.testing.assert_allclose(losses[0], np.log(2.0), rtol=1e-5, atol=1e-6)
  assert np.mean(losses[-5:]) < 0.5 * np.log(2.0)
  # Held-out pairs of the same kind are ranked right.
  hc, hr = _pairs(
    [f"{i}+1\nanswer: {i + 1}" for i in range(3)],
    [f"{i}+1\nanswer: x{i}" for i in range(3)],
  )
  assert bt.pairwise_accuracy(trained, hc, hr, CFG) == 1.0
  # Deterministic in the seed (bit for bit: the same programs on the same
  # inputs); no pairs or no steps: params unchanged.
  again, _ = bt.train_bt(
    params, CFG, chosen, rejected, steps=40, batch_size=4, lr=3e-3
  )
  jax.tree.map(np.testing.assert_array_equal, trained, again)
  empty = tuple(x[:0] for x in chosen)
  same, none = bt.train_bt(
    params, CFG, empty, empty, steps=5, batch_size=4, lr=1
  )
  assert same is params and none == []


def test_train_bt_stopped_by_sigterm_resumes_as_one_run(tmp_path, monkeypatch):
  """SIGTERM during step 3 of 8 (sent from inside it): the step finishes,
  the training is checkpointed and Stopped raised; the same call again
  resumes at step 3 and ends with the weights and losses of one run."""
  import os
  import signal

  from rlreason.train import checkpoint

  params = rm.init(CFG, jax.random.key(0))
  chosen, rejected = _pairs(
    [f"{i}+{i}\nanswer: {2 * i}" for i in range(6)],
    [f"{i}+{i}\nanswer: x{i}" for i in range(6)],
  )
  kw = dict(steps=8, batch_size=4, lr=3e-3, seed=1)  # 6 pairs: reshuffles
  whole, losses = bt.train_bt(params, CFG, chosen, rejected, **kw)
  make_update, calls = bt.bt_update, []

  def bt_update(*args, **kwargs):
    update = make_update(*args, **kwargs)

    def killed_at_step_3(*a):
      calls.append(1)
      if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGTERM)
      return update(*a)

    return killed_at_step_3

  monkeypatch.setattr(bt, "bt_update", bt_update)
  resume = lambda: checkpoint.Resumable(str(tmp_path / "bt"), "bt")  # noqa: E731
  with pytest.raises(checkpoint.Stopped, match="stopped at step 3 of 8"):
    bt.train_bt(params, CFG, chosen, rejected, resume=resume(), **kw)
  again, resumed = bt.train_bt(
    params, CFG, chosen, rejected, resume=resume(), **kw
  )
  assert len(calls) == 3 + 5 and resumed == losses
  jax.tree.map(np.testing.assert_array_equal, whole, again)


def test_bt_steps_update_in_place_and_leave_the_callers_weights():
  """train_bt's step donates the reward model's weights and Adam moments
  (one copy of each per step: a 7B reward model's fp32 weights and
  moments are 84 GB), on buffers of its own: the weights it starts from
  (rm_grpo's policy, held by the run) are neither deleted nor changed."""
  params = rm.init(CFG, jax.random.key(0))
  before = jax.tree.map(np.asarray, params)
  chosen, rejected = _pairs(["answer: 1", "answer: 2"], ["answer: x", "a: y"])
  trained, _ = bt.train_bt(
    params, CFG, chosen, rejected, steps=2, batch_size=2, lr=1e-2
  )
  assert not any(x.is_deleted() for x in jax.tree.leaves(params))
  jax.tree.map(np.testing.assert_array_equal, params, before)
  assert not all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(before))
  )
  # The step's inputs are the outputs' buffers.
  opt = optax.adamw(1e-3)
  state = opt.init(params)
  own = jax.tree.map(jnp.copy, params)
  weights = jnp.full(len(chosen[0]), 1 / len(chosen[0]))
  bt.bt_update(CFG, opt)(own, state, *chosen, *rejected, weights)
  assert all(x.is_deleted() for x in jax.tree.leaves((own, state)))


def test_bradley_terry_training_on_the_mesh_matches_one_device(monkeypatch):
  """rm_grpo trains its reward model on the run's mesh: each minibatch's
  pairs split by rows, the activations laid out by batch (traced under
  the activation mesh); the same losses and weights as on one device."""
  from rlreason import mesh as mesh_lib
  from rlreason.sampling import padding

  good = [f"answer: {i + 1}" for i in range(8)]
  bad = [f"answer: x{i}" for i in range(8)]
  enc = lambda texts: padding.pad_prompts([TOK.encode(t) for t in texts], 0)
  chosen, rejected = enc(good), enc(bad)
  params = rm.init(CFG, jax.random.key(0))
  kw = dict(steps=3, batch_size=8, lr=1e-2, seed=0)
  want, want_losses = bt.train_bt(params, CFG, chosen, rejected, **kw)
  seen = []
  forward = rm.score

  def spy(*args):
    seen.append(mesh_lib.active_mesh())
    return forward(*args)

  monkeypatch.setattr(rm, "score", spy)
  mesh = mesh_lib.make_mesh(2, 4, 1)
  sharded = rm.frozen_on_mesh(params, CFG, mesh, "float32")
  got, losses = bt.train_bt(sharded, CFG, chosen, rejected, mesh=mesh, **kw)
  assert seen and all(m is mesh for m in seen), seen
  np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-5)
  # atol: Adam (lr 1e-2) divides near-zero gradients by their own size, so
  # the split sums' rounding moves a weight by more than an ulp (an AMD
  # EPYC host, session 63: one of 512 off by 2.1e-5 after 3 steps).
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4),
    got,
    want,
  )
  acc = bt.pairwise_accuracy(
    got, chosen, rejected, CFG, batch_size=8, mesh=mesh
  )
  assert acc == bt.pairwise_accuracy(want, chosen, rejected, CFG)


def test_micro_batched_bt_steps_take_the_one_step_update():
  """--rm_micro_batches: a step's pairs in M gradient-accumulation
  micro-batches (bt_update over aggregation.accumulate) give the loss and
  gradient of one step over all of them (plain SGD at rate 1: the update
  is minus the gradient), each pair's chosen and rejected rows together
  in one micro-batch."""
  good = [f"answer: {i + 1}" for i in range(8)]
  bad = [f"answer: x{i}" + "!" * (i % 3) for i in range(8)]
  chosen, rejected = _pairs(good, bad)
  params = rm.init(CFG, jax.random.key(0))
  params["head"]["w"] = jax.random.normal(jax.random.key(1), (CFG.d_model,))
  opt = optax.sgd(1.0)
  weights = jnp.full(8, 1 / 8)  # a step's mean, as train_bt weighs pairs

  def step(micro):
    own = jax.tree.map(jnp.copy, params)
    update = bt.bt_update(CFG, opt, None, micro)
    new, _, loss = update(own, opt.init(own), *chosen, *rejected, weights)
    return float(loss), jax.tree.map(jnp.subtract, params, new)

  want_loss, want = step(1)
  assert want_loss > 0 and np.abs(want["head"]["w"]).max() > 1e-3
  for micro in (2, 4):
    loss, grads = step(micro)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      grads,
      want,
    )


def test_train_bt_micro_batches_divide_the_step_or_fail_early(monkeypatch):
  """--rm_micro_batches must divide --rm_batch_size (a ValueError naming
  both, before any compute); with fewer pairs than a step's, a step takes
  the largest multiple of the micro-batches there are pairs for, or all
  pairs in one micro-batch when there are fewer pairs than micro-batches."""
  three = _pairs(["answer: 1", "answer: 2", "answer: 3"], ["x", "y", "z"])
  params = rm.init(CFG, jax.random.key(0))
  kw = dict(steps=2, batch_size=4, lr=1e-3)
  with pytest.raises(ValueError, match="micro_batches=3 .* batch_size=4"):
    bt.train_bt(params, CFG, *three, micro_batches=3, **kw)
  seen = []
  make = bt.bt_update

  def spy(model_cfg, optimizer, mesh=None, micro_batches=1, options=None):
    update = make(model_cfg, optimizer, mesh, micro_batches, options)

    def run(p, s, c_tok, *rest):
      seen.append((micro_batches, c_tok.shape[0]))
      return update(p, s, c_tok, *rest)

    return run

  monkeypatch.setattr(bt, "bt_update", spy)
  _, losses = bt.train_bt(params, CFG, *three, micro_batches=2, **kw)
  assert seen == [(2, 2), (2, 2)], seen
  # A zero head scores every sequence the same: the first loss is log 2.
  np.testing.assert_allclose(losses[0], np.log(2), rtol=1e-6, atol=1e-6)
  seen.clear()
  one = tuple((t[:1], p[:1]) for t, p in three)
  bt.train_bt(params, CFG, *one, micro_batches=2, **kw)
  assert seen == [(1, 1), (1, 1)], seen


def test_train_bt_compiles_its_step_with_the_options_it_is_given():
  """rm_grpo passes the policy's --train_temp_budget_mib (libtpu's option,
  planned for reward_model_train): the step compiles with them. An option
  XLA:CPU does not know fails that compile; a known one at its default
  trains the same."""
  chosen, rejected = _pairs(["answer: 1", "answer: 2"], ["x", "y"])
  params = rm.init(CFG, jax.random.key(0))
  kw = dict(steps=2, batch_size=2, lr=1e-2)
  _, want = bt.train_bt(params, CFG, chosen, rejected, **kw)
  with pytest.raises(jax.errors.JaxRuntimeError, match="not_an_xla_option"):
    bt.train_bt(
      params, CFG, chosen, rejected,
      compiler_options={"not_an_xla_option": 1}, **kw,
    )  # fmt: skip
  _, got = bt.train_bt(
    params, CFG, chosen, rejected,
    compiler_options={"xla_cpu_enable_fast_math": False}, **kw,
  )  # fmt: skip
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_weighted_loss_is_the_weights_sum_of_the_pairs_losses():
  """-sum w_i log sigmoid(r(c_i) - r(r_i)): uniform weights 1 / N give
  the mean; a weight on one pair alone gives that pair's loss."""
  good = [f"answer: {i + 1}" for i in range(4)]
  bad = [f"answer: x{i}" for i in range(4)]
  chosen, rejected = _pairs(good, bad)
  params = rm.init(CFG, jax.random.key(0))
  params["head"]["w"] = jax.random.normal(jax.random.key(1), (CFG.d_model,))
  rc, rr = rm.score(params, *chosen, CFG), rm.score(params, *rejected, CFG)
  # -log sigmoid(d) = log(1 + exp(-d)), d = r(chosen) - r(rejected)
  each = np.logaddexp(0.0, -(np.asarray(rc) - np.asarray(rr)))
  pairs = (params, chosen, rejected, CFG)
  loss = lambda w: float(bt.bradley_terry_loss(*pairs, w))
  np.testing.assert_allclose(
    loss(jnp.full(4, 0.25)), each.mean(), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    float(bt.bradley_terry_loss(params, chosen, rejected, CFG)),
    each.mean(),
    rtol=1e-5,
    atol=1e-6,
  )
  np.testing.assert_allclose(
    loss(jnp.array([0.0, 0.0, 1.0, 0.0])), each[2], rtol=1e-5, atol=1e-6
  )
  assert np.ptp(each) > 1e-3  # the pairs' losses differ: the test can fail


def test_step_pairs_weigh_each_drawn_prompt_alike_and_pad_at_zero():
  # Two prompts of 3 and 1 pairs in a step of 6 slots: each prompt 1/2,
  # split among its pairs; two weight-0 copies of the first pair.
  idx, w = bt._step_pairs([np.array([4, 5, 6]), np.array([9])], 6)
  np.testing.assert_array_equal(idx, [4, 5, 6, 9, 4, 4])
  np.testing.assert_allclose(
    w, [1 / 6, 1 / 6, 1 / 6, 1 / 2, 0, 0], rtol=1e-6, atol=1e-7
  )
  # Single pairs filling the step: each 1 / rows (the mean).
  idx, w = bt._step_pairs([np.array([i]) for i in (3, 1, 2)], 3)
  np.testing.assert_array_equal(idx, [3, 1, 2])
  np.testing.assert_allclose(w, [1 / 3] * 3, rtol=1e-6, atol=1e-7)


def test_train_bt_by_prompt_keeps_a_prompts_pairs_in_one_step(monkeypatch):
  """groups (rm_grpo's --rm_batching=prompt, InstructGPT's batching):
  every step holds whole prompts, each prompt's pairs weighing 1 / the
  step's prompts in all, split evenly; the rest of the step weight 0;
  every prompt is drawn before any repeats (here 5 prompts of 1-3 pairs,
  steps of 4 slots)."""
  sizes = [3, 1, 2, 3, 1]
  groups = np.repeat(np.arange(5) * 10, sizes)  # any ids
  m = len(groups)
  good = [f"answer: {i}" for i in range(m)]  # pair i's chosen text: "i"
  bad = [f"answer: x{i}" for i in range(m)]
  chosen, rejected = _pairs(good, bad)
  steps, make = [], bt.bt_update

  def spy(*args, **kwargs):
    update = make(*args, **kwargs)

    def run(params, state, c_tok, c_pos, r_tok, r_pos, weights):
      texts = [TOK.decode([t for t in row if t]) for row in np.asarray(c_tok)]
      pair = [int(t.split(": ")[1]) for t in texts]
      steps.append((pair, np.asarray(weights)))
      return update(params, state, c_tok, c_pos, r_tok, r_pos, weights)

    return run

  monkeypatch.setattr(bt, "bt_update", spy)
  params = rm.init(CFG, jax.random.key(0))
  _, losses = bt.train_bt(
    params, CFG, chosen, rejected, steps=4, batch_size=4, lr=1e-2,
    groups=groups,
  )  # fmt: skip
  assert len(losses) == 4
  drawn = []
  for pair, w in steps:
    real = [p for p, x in zip(pair, w) if x > 0]
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-6, atol=1e-6)
    prompts = list(dict.fromkeys(groups[p] for p in real))  # draw order
    for g in prompts:
      mine = [p for p in real if groups[p] == g]
      assert sorted(mine) == list(np.flatnonzero(groups == g))  # whole
      got = [x for p, x in zip(pair, w) if x > 0 and groups[p] == g]
      want = [1 / len(mine) / len(prompts)] * len(mine)
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert len(pair) == 4 and len(real) == sum(w > 0)
    drawn += prompts
  assert sorted(drawn[:5]) == [0, 10, 20, 30, 40], drawn
  # A prompt with more pairs than a step holds is refused by name.
  with pytest.raises(ValueError, match="a prompt has 3 preference pairs"):
    bt.train_bt(
      params, CFG, chosen, rejected, steps=1, batch_size=2, lr=1e-2,
      groups=groups,
    )  # fmt: skip


def test_the_cosine_schedule_ends_at_a_tenth_and_train_bt_steps_by_it(
  monkeypatch,
):
  """InstructGPT's reward-model schedule: lr at step 0, (0.1 + 0.9 x 0.5)
  lr = 0.55 lr halfway, 0.1 lr at the end (constant: lr throughout); the
  optimizer train_bt builds moves a weight by exactly that rate on each
  step of a constant gradient (Adam's step of a constant gradient is the
  rate itself, its moments' bias corrected)."""
  lr, steps = 1e-3, 10
  cos = bt.learning_rate(lr, steps, "cosine")
  for t, want in ((0, 1.0), (5, 0.55), (10, 0.1), (20, 0.1)):
    np.testing.assert_allclose(cos(t), want * lr, rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(
    bt.learning_rate(lr, steps, "constant")(7), lr, rtol=1e-6, atol=1e-12
  )
  with pytest.raises(ValueError, match="schedule='linear'"):
    bt.learning_rate(lr, steps, "linear")

  seen = []
  make = bt.bt_update
  monkeypatch.setattr(
    bt,
    "bt_update",
    lambda model_cfg, opt, *a: seen.append(opt) or make(model_cfg, opt, *a),
  )
  params = rm.init(CFG, jax.random.key(0))
  chosen, rejected = _pairs(["answer: 1"], ["answer: x"])
  bt.train_bt(
    params, CFG, chosen, rejected, steps=steps, batch_size=1, lr=lr,
    schedule="cosine",
  )  # fmt: skip
  (opt,) = seen
  w = {"w": jnp.zeros(())}
  state = opt.init(w)
  for t in range(steps):
    upd, state = opt.update({"w": jnp.ones(())}, state, w)
    np.testing.assert_allclose(-upd["w"], cos(t), rtol=1e-4, atol=1e-9)
