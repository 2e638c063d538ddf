"""plan/hlo_loops: a compiled program's bytes with each loop body times its
trip count, against hand-counted bytes of a small HLO module and XLA's own
count of a compiled scan; the bytes its collectives send, by hand."""

import jax
import jax.numpy as jnp
import pytest

from rlreason.plan import hlo_loops
from rlreason.plan import hlo_text

T3 = "(s32[], f32[8,16], f32[8,16])"
# The loop's condition: counter < 8.
COND = f"""%cond (u: {T3}) -> pred[] {{
  %u = {T3} parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}}
"""
MODULE = f"""HloModule m

%fused_slice (p0: f32[8,16], p1: s32[]) -> f32[1,16] {{
  %p0 = f32[8,16]{{1,0}} parameter(0)
  %p1 = s32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %ds = f32[1,16]{{1,0}} dynamic-slice(%p0, %p1, %c), slice={{1,16}}
}}

%fused_dus (q0: f32[8,16], q1: f32[1,16], q2: s32[]) -> f32[8,16] {{
  %q0 = f32[8,16]{{1,0}} parameter(0)
  %q1 = f32[1,16]{{1,0}} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[8,16]{{1,0}} dynamic-update-slice(%q0, %q1, %q2, %z)
}}

%body (t: {T3}) -> {T3} {{
  %t = {T3} parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %a = f32[8,16]{{1,0}} get-tuple-element(%t), index=1
  %b = f32[8,16]{{1,0}} get-tuple-element(%t), index=2
  %row = f32[1,16]{{1,0}} fusion(%a, %i), kind=kLoop, calls=%fused_slice
  %neg = f32[1,16]{{1,0}} negate(%row)
  %b2 = f32[8,16]{{1,0}} fusion(%b, %neg, %i), kind=kLoop, calls=%fused_dus
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %r = {T3} tuple(%i2, %a, %b2)
}}

{COND}
ENTRY %main (x: f32[8,16]) -> f32[8,16] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %zero = s32[] constant(0)
  %y = f32[8,16]{{1,0}} copy(%x)
  %init = {T3} tuple(%zero, %x, %y)
  %w = {T3} while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,16]{{1,0}} get-tuple-element(%w), index=2
}}
"""
# Bytes by hand: the entry's copy reads and writes 8 x 16 f32 (1024). One
# iteration: the slice fusion reads the row it takes (64) and the index (4)
# and writes a row (64); negate 64 + 64; the in-place update writes its row
# (64) and reads the row and the index (68), not the whole buffer; the
# counter's add 12; the condition's compare 4 + 4 + 1.
ENTRY_BYTES = 1024
ITERATION = (64 + 4 + 64) + 128 + (64 + 64 + 4) + 12 + 9


def test_hand_counted_bytes_with_the_trip_count_of_the_condition():
  e = hlo_loops.estimate(MODULE)
  assert e.flat == ENTRY_BYTES + ITERATION
  assert e.looped == ENTRY_BYTES + 8 * ITERATION
  assert e.loops == (("body", 8),) and e.unknown == ()
  assert e.factor == pytest.approx(e.looped / e.flat, rel=1e-12, abs=0)


def test_xlas_trip_count_annotation_wins_and_an_unread_loop_counts_once():
  annotated = MODULE.replace(
    "body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"3"}}'
  )
  assert hlo_loops.estimate(annotated).looped == ENTRY_BYTES + 3 * ITERATION
  # A loop XLA's partitioner made (a windowed einsum) counts once, as
  # cost_analysis counts it; one lowered from lax.scan / fori_loop
  # (op_name ".../while") is multiplied.
  made = MODULE.replace(
    "body=%body", 'body=%body, metadata={op_name="jit(f)/layer/dot_general"}'
  )
  e = hlo_loops.estimate(made)
  assert e.looped == e.flat and e.loops == () and e.partitioner_loops == 1
  own = MODULE.replace("body=%body", 'body=%body, metadata={op_name="a/while"}')
  assert hlo_loops.estimate(own).looped == ENTRY_BYTES + 8 * ITERATION
  unread = MODULE.replace("direction=LT", "direction=NE")
  e = hlo_loops.estimate(unread)
  assert e.looped == e.flat == ENTRY_BYTES + ITERATION
  assert e.unknown == ("body",)


def test_a_peeled_loops_counter_starts_past_zero():
  """XLA peels a loop's first trip out of it (TPU, a scan over layers):
  the loop's counter then starts at 1, through a copy of the constant,
  and runs N - 1 trips; the copy reads and writes 4 bytes each."""
  peeled = MODULE.replace(
    "  %zero = s32[] constant(0)\n",
    "  %c1 = s32[] constant(1)\n  %zero = s32[] copy(%c1)\n",
  )
  e = hlo_loops.estimate(peeled)
  assert e.loops == (("body", 7),) and e.unknown == ()
  assert e.looped == ENTRY_BYTES + 8 + 7 * ITERATION
  # A counter whose start is not a constant is taken to start at 0.
  unknown_start = MODULE.replace(
    "%init = {T3} tuple(%zero,", "%init = {T3} tuple(%p,"
  ).replace("  %zero = s32[] constant(0)\n", "  %p = s32[] parameter(1)\n")
  assert hlo_loops.estimate(unknown_start).loops == (("body", 8),)


HOST = "f32[8,16]{1,0:S(5)}"
ROW = "f32[1,16]{1,0}"
CTX = "u32[]{:S(2)}"  # an async copy's context
DUS = f"(({HOST}, {ROW}, s32[], s32[]), {HOST}, {CTX})"
DS = f"(({HOST}, s32[], s32[]), {ROW}, {CTX})"
# A scan writing each of 8 rows into a buffer in the host's memory (an
# async dynamic-update-slice per trip, the row's 64 bytes), then one row
# read back (async dynamic-slice, 64), the whole buffer copied back
# asynchronously (512) and once more by a plain copy (512), that row
# written to the host again in place (64), and a copy on the device (none
# of it crosses).
HOST_MODULE = f"""HloModule m

%body (t: {T3}) -> {T3} {{
  %t = {T3} parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %a = f32[8,16]{{1,0}} get-tuple-element(%t), index=1
  %h = {HOST} get-tuple-element(%t), index=2
  %z = s32[] constant(0)
  %row = {ROW} dynamic-slice(%a, %i, %z), dynamic_slice_sizes={{1,16}}
  %s = {DUS} dynamic-update-slice-start(%h, %row, %i, %z)
  %h2 = {HOST} dynamic-update-slice-done(%s)
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %r = {T3} tuple(%i2, %a, %h2)
}}

{COND}
ENTRY %main (x: f32[8,16]) -> f32[8,16] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %zero = s32[] constant(0)
  %buf = {HOST} custom-call(), custom_call_target="AllocateBuffer"
  %init = {T3} tuple(%zero, %x, %buf)
  %w = {T3} while(%init), condition=%cond, body=%body
  %hw = {HOST} get-tuple-element(%w), index=2
  %k = s32[] constant(3)
  %rs = {DS} dynamic-slice-start(%hw, %k, %zero), dynamic_slice_sizes={{1,16}}
  %rd = f32[1,16]{{1,0}} dynamic-slice-done(%rs)
  %cs = (f32[8,16]{{1,0}}, {HOST}, {CTX}) copy-start(%hw)
  %back = f32[8,16]{{1,0}} copy-done(%cs)
  %again = f32[8,16]{{1,0}} copy(%hw)
  %put = {HOST} dynamic-update-slice(%hw, %rd, %k, %zero)
  %dev = f32[8,16]{{1,0}} copy(%x)
  ROOT %sum = f32[8,16]{{1,0}} add(%back, %again)
}}
"""


def test_copies_to_and_from_the_hosts_memory_by_hand():
  e = hlo_loops.estimate(HOST_MODULE)
  assert e.loops == (("body", 8),)
  assert e.host == 8 * 64 + 64 + 512 + 512 + 64
  # Without the host's memory space nothing crosses.
  assert hlo_loops.estimate(HOST_MODULE.replace(":S(5)", "")).host == 0
  assert hlo_loops.estimate(MODULE).host == 0


def test_shape_bytes():
  assert hlo_text.shape_bytes("bf16[4,8]{1,0:T(8,128)(2,1)}") == 64
  assert hlo_text.shape_bytes("(s32[], f32[2,3]{1,0}, pred[5])") == 33
  assert hlo_text.shape_bytes("s4[16]") == 8


def test_a_compiled_nested_loop_against_xlas_count():
  """A scan of 5 steps around a fori_loop of 3: XLA's cost_analysis counts
  each body once, as `flat` does (within 5%); looped multiplies the inner
  body by 15, nearly all of the program's bytes."""

  def f(x, w):
    def step(c, _):
      c = jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ w), c)
      return c, None

    return jax.lax.scan(step, x, None, length=5)[0]

  compiled = (
    jax.jit(f).lower(jnp.ones((64, 256)), jnp.ones((256, 256))).compile()
  )
  e = hlo_loops.estimate(compiled.as_text())
  assert sorted(n for _, n in e.loops) == [3, 5] and not e.unknown
  xla = compiled.cost_analysis()["bytes accessed"]
  assert e.flat == pytest.approx(xla, rel=0.05, abs=0)
  # The inner body (the matmul reads x and w, tanh reads and writes x)
  # runs 15 times; the entry's copies and counters are a few percent.
  inner = 4 * (2 * 64 * 256 + 256 * 256) + 4 * 2 * 64 * 256
  assert e.looped == pytest.approx(15 * inner, rel=0.05, abs=0)
  assert e.factor > 10


def test_collective_bytes_by_hand_with_loops_multiplied():
  """The loop's body all-gathers its f32[2,16] shard over groups of 4
  (sends 3 x 128 bytes per trip, 8 trips) and all-reduces an f32[16]
  over 2 (2 x 1/2 x 64 bytes per trip); the entry reduce-scatters its
  f32[8,16] over 4 (3/4 x 512) and permutes f32[1,16] (64): every loop
  multiplied out, a loop XLA made (a windowed einsum) too."""
  body_ops = """  %sh = f32[2,16]{1,0} slice(%a), slice={[0:2], [0:16]}
  %ag = f32[8,16]{1,0} all-gather(%sh), replica_groups=[2,4]<=[8]
  %v = f32[16]{0} slice(%sh), slice={[0:16]}
  %ar = f32[16]{0} all-reduce(%v), replica_groups=mesh['x'=2,'y'=4] {'x'}
"""
  module = MODULE.replace(
    "  %one = s32[] constant(1)\n", body_ops + "  %one = s32[] constant(1)\n"
  ).replace(
    "  %init =",
    "  %rs = f32[2,16]{1,0} reduce-scatter(%y), replica_groups={{0,1,2,3},"
    "{4,5,6,7}}, dimensions={0}\n"
    "  %row0 = f32[1,16]{1,0} slice(%y), slice={[0:1], [0:16]}\n"
    "  %cp = f32[1,16]{1,0} collective-permute-start(%row0), "
    "source_target_pairs={{0,1},{1,0}}\n"
    "  %init =",
  )
  per_trip = 3 * 128 + 2 * (1 / 2) * 64
  entry = 3 / 4 * 512 + 64
  assert hlo_loops.estimate(module).ici == pytest.approx(
    entry + 8 * per_trip, rel=1e-12, abs=0
  )
  made = module.replace(
    "body=%body", 'body=%body, metadata={op_name="jit(f)/dot_general"}'
  )
  assert hlo_loops.estimate(made).ici == hlo_loops.estimate(module).ici
  # A loop that stops on a condition of its own (a sampler's decode loop)
  # counts once; its share is `ici_unread`, for the caller to scale.
  unread = hlo_loops.estimate(module.replace("direction=LT", "direction=NE"))
  assert unread.ici == pytest.approx(entry + per_trip, rel=1e-12, abs=0)
  assert unread.ici_unread == pytest.approx(per_trip, rel=1e-12, abs=0)
  assert hlo_loops.estimate(module).ici_unread == 0
  assert hlo_loops.estimate(MODULE).ici == 0


@pytest.mark.parametrize(
  ("attrs", "n"),
  [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}", 4),
    ("replica_groups=[4,2]<=[8], dimensions={0}", 2),
    ("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}", 4),
    ("replica_groups=mesh['a'=2,'b'=2,'c'=4] {'a','c'}, dimensions={1}", 8),
    ("channel_id=3", 0),
  ],
)
def test_group_size(attrs, n):
  assert hlo_loops.group_size(attrs) == n


def test_a_rare_branch_in_an_unread_loop_is_not_every_trips():
  """Continuous batching's refill: a conditional in the decode loop whose
  one branch all-reduces (2 x 1/2 x 64 bytes over 2 devices) and whose
  other sends nothing. `ici` counts the costly branch (the loop once);
  `ici_unread`, the per-trip share a caller scales by the decode steps,
  counts the cheap one."""
  branches = """
%heavy (h: f32[16]) -> f32[16] {
  %h = f32[16]{0} parameter(0)
  ROOT %hr = f32[16]{0} all-reduce(%h), replica_groups={{0,1}}
}

%light (l: f32[16]) -> f32[16] {
  ROOT %l = f32[16]{0} parameter(0)
}
"""
  body_ops = (
    "  %v = f32[16]{0} slice(%a), slice={[0:16]}\n"
    "  %p = pred[] constant(true)\n"
    "  %cnd = f32[16]{0} conditional(%p, %v, %v), "
    "true_computation=%heavy, false_computation=%light\n"
  )
  module = (
    MODULE.replace("HloModule m\n", "HloModule m\n" + branches)
    .replace(
      "  %one = s32[] constant(1)\n", body_ops + "  %one = s32[] constant(1)\n"
    )
    .replace("direction=LT", "direction=NE")
  )
  e = hlo_loops.estimate(module)
  assert e.ici == pytest.approx(64, rel=1e-12, abs=0)
  assert e.ici_unread == 0


def test_tpus_all_reduce_scatter_fusion_counts_as_a_reduce_scatter():
  """libtpu fuses a reduce-scatter as an all-reduce whose result each
  device slices (a computation named all-reduce-scatter.N): each device
  sends (n - 1) / n of the operand, not the all-reduce's twice that."""
  module = """HloModule m

%all-reduce-scatter.1 (i: f32[8,16]) -> f32[2,16] {
  %i = f32[8,16]{1,0} parameter(0)
  %ar = f32[8,16]{1,0} all-reduce(%i), replica_groups={{0,1,2,3}}
  %z = s32[] constant(0)
  ROOT %ds = f32[2,16]{1,0} dynamic-slice(%ar, %z, %z)
}

ENTRY %main (x: f32[8,16]) -> f32[2,16] {
  %x = f32[8,16]{1,0} parameter(0)
  ROOT %f = f32[2,16]{1,0} fusion(%x), kind=kCustom, calls=%all-reduce-scatter.1
}
"""
  assert hlo_loops.estimate(module).ici == pytest.approx(
    3 / 4 * 512, rel=1e-12, abs=0
  )


T2 = "(s32[], f32[16])"
AG = "replica_groups={{0,1,2,3}}, dimensions={0}"
PAIRS = "source_target_pairs={{0,1},{1,0}}"
AT = 'metadata={op_name="jit(run)/while%s"}'
RW, RS = AT % "/body/refill/while", AT % "/body/refill/scatter"
ROUNDS = f"""HloModule rounds

%rbody (t: {T2}) -> {T2} {{
  %t = {T2} parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %a = f32[16]{{0}} get-tuple-element(%t), index=1
  %g = f32[64]{{0}} all-gather(%a), {AG}
  %s = f32[16]{{0}} slice(%g), slice={{[0:16]}}
  ROOT %r = {T2} tuple(%i, %s)
}}

%rcond (u: {T2}) -> pred[] {{
  %u = {T2} parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %n = s32[] constant(8)
  ROOT %ne = pred[] compare(%j, %n), direction=NE
}}

%dbody (t: {T2}) -> {T2} {{
  %t = {T2} parameter(0)
  %w = {T2} while(%t), condition=%rcond, body=%rbody, {RW}
  %i = s32[] get-tuple-element(%w), index=0
  %a = f32[16]{{0}} get-tuple-element(%w), index=1
  %ar = f32[16]{{0}} all-reduce(%a), replica_groups={{{{0,1}}}}
  %cp = f32[16]{{0}} collective-permute(%ar), {PAIRS}, {RS}
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %r = {T2} tuple(%i2, %cp)
}}

ENTRY %main (x: f32[16]) -> f32[16] {{
  %x = f32[16]{{0}} parameter(0)
  %zero = s32[] constant(0)
  %init = {T2} tuple(%zero, %x)
  %w = {T2} while(%init), condition=%rcond, body=%dbody, {AT % ""}
  ROOT %out = f32[16]{{0}} get-tuple-element(%w), index=1
}}
"""


def test_a_named_scopes_loop_is_apart_from_the_unread_steps():
  """Continuous batching's rounds (continuous_loop._round): an unread
  loop of rounds holds an unread refill loop, made under the "refill"
  scope, which all-gathers an f32[16] over 4 (3 x 64 bytes a trip), then
  a decode step's all-reduce over 2 (2 x 1/2 x 64) and a permute the
  refill's ops left behind in the round (64, its op_name under the
  scope). Every loop counts once in `ici`; without `apart` the round's
  all of it is per decode step (a refill charged to each); with it, a
  decode step's share is the all-reduce alone and the refill's 256
  bytes are `ici_apart`."""
  plain = hlo_loops.estimate(ROUNDS)
  assert plain.ici == pytest.approx(192 + 64 + 64, rel=1e-12, abs=0)
  assert plain.ici_unread == pytest.approx(320, rel=1e-12, abs=0)
  assert plain.ici_apart == 0
  e = hlo_loops.estimate(ROUNDS, apart="refill")
  assert e.ici == plain.ici
  assert e.ici_unread == pytest.approx(64, rel=1e-12, abs=0)
  assert e.ici_apart == pytest.approx(192 + 64, rel=1e-12, abs=0)
  # A scope's name must be a whole op_name component.
  assert hlo_loops.estimate(ROUNDS, apart="refil").ici_unread == 320
