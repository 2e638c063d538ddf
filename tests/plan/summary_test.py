"""plan/summary.py's roofline times, by hand."""

import dataclasses
import types

import numpy as np
import pytest

from rlreason.plan import ici as ici_lib
from rlreason.plan import program
from rlreason.plan import report
from rlreason.plan import summary


class _Model:
  dtype = "bfloat16"
  n_layers, n_kv_heads, head_dim = 2, 1, 4

  def num_params(self):
    return 1000


def _rollout(rows):
  return program.Program(
    name="rollout",
    argument_bytes=500,
    output_bytes=0,
    alias_bytes=0,
    temp_bytes=0,
    code_bytes=0,
    flops=0.0,
    bytes_accessed=0.0,
    largest=[],
    rows=rows,
  )


@pytest.mark.parametrize("decode_tokens", [0, 6])
def test_rollout_time_decodes_only_the_tokens_it_samples(decode_tokens):
  """N = 8 rows of P = 4 + T = 10 tokens over 2 chips, calls of 4 rows:
  prefill 2 * params * N * (P + T - decoded) / chips / peak, then per
  decoded token each call re-reads its 500 weight bytes and the caches
  (2 * 2 layers * 1 head * 4 dims = 16 values of 2 bytes per slot, at
  P + T / 2 = 9 slots) stream once."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )
  peak, bw = 1e6, 1e3
  got = summary.times(
    cfg, _Model(), {"rollout": _rollout(4)}, 2, peak, bw, decode_tokens
  )["rollout"]
  decoded = decode_tokens or 10
  prefill = 2 * 1000 * 8 * (4 + 10 - decoded) / 2 / peak
  cache = 16 * 2 * 8 * 9 / 2
  want = prefill + decoded * (2 * 500 + cache) / bw
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_another_models_sampler_is_timed_at_its_own_shape():
  """rm_grpo's judge (Program.sampled): its N = 16 rows (8 responses x 2
  verdicts) of P = 40 prompt tokens (question, response, template) and
  T = 8 verdict tokens, a model of 3000 parameters with 3 layers, in
  calls of 8 rows: as a rollout of that shape, beside the policy's own
  rollout at the run's."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )
  judge_cfg = types.SimpleNamespace(
    num_sequences=16, max_prompt_len=40, max_new_tokens=8
  )
  judge_model = _Model()
  judge_model.n_layers = 3
  judge_model.num_params = lambda: 3000
  judge = dataclasses.replace(
    _rollout(8), name="judge", sampled=(judge_cfg, judge_model, 1)
  )
  peak, bw = 1e6, 1e3
  programs = {"rollout": _rollout(4), "judge": judge}
  got = summary.times(cfg, _Model(), programs, 2, peak, bw)
  prefill = 2 * 3000 * 16 * 40 / 2 / peak
  cache = 2 * 3 * 1 * 4 * 2 * 16 * (40 + 8 / 2) / 2
  want = prefill + 8 * (2 * 500 + cache) / bw
  np.testing.assert_allclose(got["judge"], want, rtol=1e-12, atol=0)
  alone = summary.times(cfg, _Model(), {"rollout": _rollout(4)}, 2, peak, bw)
  assert got["rollout"] == alone["rollout"]
  # Three models of that shape sampling in turn (ampo's teachers).
  three = dataclasses.replace(judge, sampled=(judge_cfg, judge_model, 3))
  got = summary.times(cfg, _Model(), {"teachers": three}, 2, peak, bw)
  np.testing.assert_allclose(got["teachers"], 3 * want, rtol=1e-12, atol=0)


def test_extra_score_forwards_are_timed_at_the_reference_forward():
  """IGPO's answer probabilities: 3 more whole-batch forwards of
  2 * params * N * (P + T) / chips / peak each, beside ref_logp's one."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )
  ref = dataclasses.replace(_rollout(4), name="ref_logp")
  got = summary.times(cfg, _Model(), {"ref_logp": ref}, 2, 1e6, 1e3, 0, 3)
  forward = 2 * 1000 * 8 * 14 / 2 / 1e6
  np.testing.assert_allclose(got["ref_logp"], forward, rtol=1e-12, atol=0)
  np.testing.assert_allclose(got["scores"], 3 * forward, rtol=1e-12, atol=0)
  # Without a reference program there is no shape to time them at.
  assert "scores" not in summary.times(cfg, _Model(), {}, 2, 1e6, 1e3, 0, 3)


def test_tree_rollout_time_reads_each_rows_whole_cache_per_round():
  """TreeRL-shaped: groups of 6 leaves = 2 roots x (1 + 1 level x 2 forks
  x 1 branch), so 8 rows per prompt with the roots' cache copy, and
  P + (1 + L) T = 4 + 2 * 10 = 24 slots per row. N = 12 leaves (2
  prompts) in calls of 8 rows (one prompt): 2 calls of 2 rounds x 10
  steps, each step re-reading the 500 weight bytes; every leaf decodes
  10 steps in its round over all 24 of its slots (16 values x 2 bytes
  each, dense); only the roots' prompts are prefilled."""
  cfg = types.SimpleNamespace(
    num_sequences=12,
    group_size=6,
    max_prompt_len=4,
    max_new_tokens=10,
    forks=2,
    fork_levels=1,
    fork_branches=1,
  )
  peak, bw = 1e6, 1e3
  got = summary.times(cfg, _Model(), {"rollout": _rollout(8)}, 2, peak, bw)
  prefill = 2 * 1000 * (2 * 2) * 4 / 2 / peak
  cache = 16 * 2 * 12 * 24 / 2
  want = prefill + 10 * (2 * 2 * 500 + cache) / bw
  np.testing.assert_allclose(got["rollout"], want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("bound", ["flops", "bytes"])
def test_reward_model_training_is_timed_once_before_the_rl(bound):
  """rm_grpo's Bradley-Terry stage: --rm_steps = 5 steps of 2 x 3 pairs'
  rows of P + T = 14 tokens, each max(6 * RM params (2000) * tokens * 4/3
  (remat) / chips / peak, compiled bytes / bandwidth); not part of the RL
  step's time."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10, rm_steps=5
  )
  model = _Model()
  model.remat = True
  moved = 1e9 if bound == "bytes" else 0.0
  bt = dataclasses.replace(
    _rollout(6),
    name="reward_model_train",
    model_params=2000,
    bytes_accessed=moved,
  )
  peak, bw = 1e6, 1e3
  flops = 6 * 2000 * 6 * 14 * (4 / 3) / 2 / peak
  want = 5 * max(flops, moved / bw)
  got = summary.before_rl(cfg, model, {"reward_model_train": bt}, 2, peak, bw)
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
  assert summary.before_rl(cfg, model, {}, 2, peak, bw) == 0.0
  per_step = summary.times(cfg, model, {"reward_model_train": bt}, 2, peak, bw)
  assert "reward_model_train" not in per_step, per_step


def test_a_reward_model_training_over_the_slice_is_told_its_knobs():
  """A Bradley-Terry step over the budget: the advice names its
  temporaries and --rm_micro_batches (with the run's value), then
  --rm_batch_size; one under the budget gets none."""
  from rlreason.plan import program as program_lib

  cfg = types.SimpleNamespace(rm_micro_batches=2)
  over = program_lib.Program(
    "reward_model_train", 1 << 28, 0, 0, 3 << 30, 0, 0, 0, []
  )
  (line,) = summary.advice({"reward_model_train": over}, {}, cfg, 2 << 30)
  assert line == (
    "reward_model_train: 3.0 GiB of temporaries: raise --rm_micro_batches "
    "(now 2), or fewer pairs per Bradley-Terry step (--rm_batch_size)"
  ), line
  assert summary.advice({"reward_model_train": over}, {}, cfg, 8 << 30) == []


def test_a_train_step_over_the_slice_at_one_row_per_shard_is_told_tensor():
  """A train step over the budget whose micro-batch still holds more rows
  than batch shards: raise --micro_batches; at one row per shard (seele's
  8k-token rows on v5e-8 in 16 micro-batches of 8) more micro-batches
  cannot split it, and the advice names --mesh_tensor instead (and
  --sequence_parallel, with a tensor split and without it), unless the
  split already spans the model's KV heads; rematerialised layers are
  told they may keep their inputs in the host's memory."""
  from rlreason.plan import program as program_lib

  cfg = types.SimpleNamespace(
    num_sequences=128, minibatches=1, micro_batches=16
  )
  over = program_lib.Program("train_step", 1 << 28, 0, 0, 3 << 30, 0, 0, 0, [])
  (line,) = summary.advice({"train_step": over}, {}, cfg, 2 << 30, 8)
  assert line == (
    "train_step: 3.0 GiB of temporaries at one row per batch shard (8 rows "
    "per micro-batch, 8 shards): split each row's activations over more "
    "chips (--mesh_tensor, now 1), or a larger slice"
  ), line
  # With a tensor split, and without sequence parallelism: both named.
  split = types.SimpleNamespace(**vars(cfg), mesh_tensor=4)
  (line,) = summary.advice({"train_step": over}, {}, split, 2 << 30, 8)
  assert line.endswith(
    "(--mesh_tensor, now 4; --sequence_parallel splits each layer's saved "
    "input over it), or a larger slice"
  ), line
  split.sequence_parallel = True
  (line,) = summary.advice({"train_step": over}, {}, split, 2 << 30, 8)
  assert line.endswith("(--mesh_tensor, now 4), or a larger slice"), line
  # A split that spans the model's KV heads cannot grow (truncated_ppo's
  # v5e-256 miss: 8 of Qwen2.5-32B's 8); below them it can.
  kw = dict(kv_heads=4)
  (line,) = summary.advice({"train_step": over}, {}, split, 2 << 30, 8, **kw)
  assert line.endswith(
    "shards): the tensor split (4) already spans the model's 4 KV heads: "
    "a larger slice, or a chip with more memory"
  ), line
  kw = dict(kv_heads=8)
  (line,) = summary.advice({"train_step": over}, {}, split, 2 << 30, 8, **kw)
  assert line.endswith("(--mesh_tensor, now 4), or a larger slice"), line
  # Rematerialised layers keep their inputs: offloaded to the host's
  # memory, unless they already are.
  split.remat, split.remat_policy = True, "full"
  (line,) = summary.advice({"train_step": over}, {}, split, 2 << 30, 8, **kw)
  assert line.endswith(
    "(--mesh_tensor, now 4), --remat_policy=offload (each layer's saved "
    "input in the host's memory), or a larger slice"
  ), line
  (line,) = summary.advice(
    {"train_step": over}, {}, split, 2 << 30, 8, kv_heads=4
  )
  assert line.endswith(
    "4 KV heads: --remat_policy=offload (each layer's saved input in the "
    "host's memory), a larger slice, or a chip with more memory"
  ), line
  split.remat_policy = "offload"
  (line,) = summary.advice(
    {"train_step": over}, {}, split, 2 << 30, 8, kv_heads=4
  )
  assert line.endswith("4 KV heads: a larger slice, or a chip with more memory")
  (line,) = summary.advice({"train_step": over}, {}, cfg, 2 << 30, 4)
  assert line == (
    "train_step: 3.0 GiB of temporaries: raise --micro_batches (now 16), "
    "keep --remat on"
  ), line
  assert summary.advice({"train_step": over}, {}, cfg, 8 << 30, 8) == []


def test_a_rollout_bound_by_its_collectives_is_told_its_own_tensor_split():
  """A rollout whose collectives take most of the RL step (its weights
  gathered every decode step): the advice names --rollout_tensor, or,
  where the sampler's tensor split already spans the KV heads,
  --rollout_layout=replicated; at half the step or less, nothing."""
  cfg = types.SimpleNamespace()
  (line,) = summary.advice({}, {}, cfg, 8 << 30, 0, {"rollout": 900.0}, 1000)
  assert line.startswith("rollout: its collectives take 900 s of the 1000 s")
  assert "--rollout_tensor=N" in line, line
  # The sampler's split already at the model's KV heads (dapo on v5e-256:
  # Qwen2.5-32B's 8 at --mesh_tensor=8): no larger one divides them.
  at_heads = types.SimpleNamespace(mesh_tensor=8)
  args = (8 << 30, 0, {"rollout": 900.0}, 1000)
  (line,) = summary.advice({}, {}, at_heads, *args, kv_heads=8)
  assert "--rollout_tensor" not in line, line
  assert "split (8) already spans the model's 8 KV heads" in line, line
  assert "--rollout_layout=replicated" in line, line
  (line,) = summary.advice({}, {}, at_heads, *args, kv_heads=16)
  assert "--rollout_tensor=N" in line, line
  own = types.SimpleNamespace(mesh_tensor=8, rollout_tensor=4)
  (line,) = summary.advice({}, {}, own, *args, kv_heads=8)
  assert "--rollout_tensor=N" in line, line
  assert summary.advice({}, {}, cfg, 8 << 30, 0, {"rollout": 500.0}, 1000) == []
  assert (
    summary.advice({}, {}, cfg, 8 << 30, 0, {"train_step": 900.0}, 1000) == []
  )


def test_the_flags_the_planner_set_are_printed_for_the_run():
  """Program.run_flags (aot.compile_run's fewer rollout rows, more
  Bradley-Terry micro-batches) each print as the flag the run needs; a
  rollout's estimated rows print beside its compiled bytes."""
  bt = dataclasses.replace(
    _rollout(6),
    name="reward_model_train",
    run_flags={"rm_micro_batches": 4},
  )
  ro = dataclasses.replace(
    _rollout(8),
    run_flags={"rollout_rows": 8},
    output_bytes=1 << 30,
    temp_bytes=3 << 30,
    estimate_bytes=5 << 30,
  )
  assert (ro.rows_flag, bt.rows_flag) == (8, 0)
  s = summary.Summary(
    peak_bytes=1000,
    hbm_bytes=1 << 30,
    fits=True,
    margin=0.9,
    step_seconds=1.0,
    train_seconds=1.0,
    mfu=0.5,
    errors={},
    programs={"rollout": ro, "reward_model_train": bt},
    advice=[],
  )
  lines = report.text(s).splitlines()
  want = (
    "      at --rm_micro_batches=4: more Bradley-Terry micro-batches than "
    "the config's; the run needs the same",
    "      at --rollout_rows=8: other rows per call than the loop would "
    "size from free memory (its estimate); the run needs the same",
    # and the rows' estimate (rollout_memory) beside the compiled bytes
    "      its rows estimated at 5.00 GiB (rollout_memory), compiled to "
    "4.00 GiB (out - alias + temp): 1.25x",
  )
  assert set(want) <= set(lines), lines
  assert not any(
    "estimated" in line
    for line in report.text(
      dataclasses.replace(s, programs={"reward_model_train": bt})
    ).splitlines()
  )


def test_ici_bounds_each_program_times_its_calls():
  """A train step whose collectives send 1 GB per call, 2 epochs x 2
  minibatches, over 4 GB/s of bidirectional ICI (2 GB/s each way): 2 s,
  above its compute (FLOPs ~0); a rollout of N = 8 rows in calls of 4
  sending 0.5 GB each: 2 x 0.25 s, above its roofline decode; the
  reference forward, 1 call of 8 rows, under its FLOPs: unchanged."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10, ppo_epochs=2,
    minibatches=2,
  )  # fmt: skip
  train = dataclasses.replace(
    _rollout(0), name="train_step", ici_bytes=1e9, decoders=1
  )
  roll = dataclasses.replace(_rollout(4), ici_bytes=0.5e9)
  ref = dataclasses.replace(_rollout(8), name="ref_logp", ici_bytes=1.0)
  programs = {"train_step": train, "rollout": roll, "ref_logp": ref}
  model = _Model()
  model.remat, model.n_heads = False, 1
  peak, bw = 1e6, 1e9
  plain = summary.times(cfg, model, programs, 2, peak, bw)
  got = summary.times(cfg, model, programs, 2, peak, bw, ici_bandwidth=4e9)
  ici = ici_lib.ici_times(cfg, programs, 4e9)
  np.testing.assert_allclose(ici["train_step"], 2.0, rtol=1e-12, atol=0)
  np.testing.assert_allclose(ici["rollout"], 0.5, rtol=1e-12, atol=0)
  assert plain["train_step"] < 2.0 and got["train_step"] == ici["train_step"]
  assert plain["rollout"] < 0.5 and got["rollout"] == ici["rollout"]
  assert got["ref_logp"] == plain["ref_logp"] > ici["ref_logp"]
  assert ici_lib.ici_times(cfg, programs, 0.0) == {}


def test_a_samplers_decode_loop_ici_counts_every_decode_step():
  """The decode loop stops when every row has: the HLO counts its body's
  0.1 GB once (Program.ici_unread). Per RL step: T = 10 steps in each of
  2 calls of 4 rows, plus the rest (0.4 GB: the prefill) once per call;
  at 2 GB/s each way."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )  # fmt: skip
  roll = dataclasses.replace(_rollout(4), ici_bytes=0.5e9, ici_unread=0.1e9)
  got = ici_lib.ici_times(cfg, {"rollout": roll}, 4e9)["rollout"]
  np.testing.assert_allclose(
    got, (2 * 0.4 + 2 * 10 * 0.1) / 2, rtol=1e-12, atol=0
  )
  # Multi-turn: only the 6 action tokens decode.
  got = ici_lib.ici_times(cfg, {"rollout": roll}, 4e9, decode_tokens=6)
  np.testing.assert_allclose(
    got["rollout"], (2 * 0.4 + 2 * 6 * 0.1) / 2, rtol=1e-12, atol=0
  )


def test_a_tree_samplers_ici_counts_its_rounds_decode_steps():
  """TreeRL's shape (as in the roofline's tree test): 2 calls of one
  prompt, each decoding 2 rounds of T = 10 steps; the rest once per call.
  The roofline and the ICI bound count calls and steps the same way
  (ici.sampler_calls)."""
  cfg = types.SimpleNamespace(
    num_sequences=12, group_size=6, max_prompt_len=4, max_new_tokens=10,
    forks=2, fork_levels=1, fork_branches=1,
  )  # fmt: skip
  assert ici_lib.sampler_calls(cfg, 8) == (2, 20)
  roll = dataclasses.replace(_rollout(8), ici_bytes=0.5e9, ici_unread=0.1e9)
  got = ici_lib.ici_times(cfg, {"rollout": roll}, 4e9)["rollout"]
  np.testing.assert_allclose(got, 2 * (0.4 + 20 * 0.1) / 2, rtol=1e-12, atol=0)
  plain = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )  # fmt: skip
  assert ici_lib.sampler_calls(plain, 3) == (3, 10)
  assert ici_lib.sampler_calls(plain, 0, decode_tokens=6) == (1, 6)
  assert ici_lib.sampler_calls(plain, 8, decode_tokens=12) == (1, 10)


def test_continuous_batchings_refills_count_once_each():
  """A continuous-batching program: one call of the N = 8 rows through 4
  slots, refilled 4 times (Program.refills: 2 prompts each), each refill
  sending 0.2 GB (Program.ici_refill), each decode step 0.1 GB, the rest
  (casting the weights) 0.05 GB. Per RL step: the rest once, 4 refills,
  and the decode steps of 2 calls' worth of T = 10; at 2 GB/s each way."""
  cfg = types.SimpleNamespace(
    num_sequences=8, max_prompt_len=4, max_new_tokens=10
  )  # fmt: skip
  roll = dataclasses.replace(
    _rollout(4), ici_bytes=0.35e9, ici_unread=0.1e9, ici_refill=0.2e9,
    refills=4,
  )  # fmt: skip
  got = ici_lib.ici_times(cfg, {"rollout": roll}, 4e9)["rollout"]
  np.testing.assert_allclose(
    got, (0.05 + 4 * 0.2 + 2 * 10 * 0.1) / 2, rtol=1e-9, atol=0
  )


def test_loops_print_how_their_bytes_count():
  """Loops whose trip count was read are multiplied out; a decode loop's
  (unread: 0) is counted once, and said to be."""
  assert report._loops(()) == "no loops"  # noqa: SLF001
  assert report._loops((8, 32)) == "loops x8, x32 multiplied out"  # noqa: SLF001
  assert report._loops((0, 0, 0)) == (  # noqa: SLF001
    "3 loops of unread trip count counted once"
  )
  assert report._loops((16, 0)) == (  # noqa: SLF001
    "loops x16 multiplied out; 1 loop of unread trip count counted once"
  )


def test_host_copies_are_reported_per_rl_step_beside_the_train_time():
  """--remat_policy=offload's copies between chip and host (3 GB a
  train-step call, 2 epochs x 2 minibatches of calls an RL step): 12 GB
  per chip, not in the roofline (the same time as without them), and
  the host bandwidth that would hide them behind it."""
  from experiments import grpo
  from rlreason.plan import aot

  cfg = dataclasses.replace(grpo.TinyConfig(), ppo_epochs=2, minibatches=2)
  step = program.Program(
    "train_step", 1 << 20, 0, 0, 1 << 20, 0, 1e9, 1e9, [],
    host_temp_bytes=1 << 30, host_copy_bytes=3e9,
  )  # fmt: skip
  plain = dataclasses.replace(step, host_temp_bytes=0, host_copy_bytes=0.0)
  kw = dict(hbm_bytes=16 << 30, devices=1, peak_flops=1e12,
            hbm_bandwidth=1e11)  # fmt: skip
  model = aot.model_config(cfg)
  s = summary.summarize({"train_step": step}, cfg, model, **kw)
  without = summary.summarize({"train_step": plain}, cfg, model, **kw)
  assert s.host_copy_bytes == 12e9 and without.host_copy_bytes == 0
  assert s.train_seconds == without.train_seconds > 0
  text = report.text(s)
  rate = 12e9 / s.train_seconds / 1e9
  assert (
    "  host copies per RL step: 12.00 GB per chip (train_step, not in its "
    f"time): hidden behind its roofline at >= {rate:.3f} GB/s per chip "
    "between chip and host"
  ) in text, text
  assert "1.00 GiB of temporaries in the host's memory" in text
  assert "3.00 GB copied out and back per call" in text
  assert "host copies" not in report.text(without)
