"""aot.compile_run's retries under a temporaries budget (plan/retry.py),
on a fake compiler (the CPU's mesh, a program that is out of HBM at the
compiler's default) and on fake compiles: the decisions, not libtpu's
numbers (tests/plan/plan_test.py has those)."""

import dataclasses
import re

import pytest

from experiments import grpo
from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason.plan import aot
from rlreason.plan import program as program_lib
from rlreason.plan import retry
from rlreason.plan import rollout as plan_rollout
from rlreason.plan import state as plan_state
from rlreason.plan import report
from rlreason.plan import summary
from rlreason.rl import objective
from rlreason.sampling import rollout_memory

MIB = 1 << 20
GIB = 1 << 30
OOM = "RESOURCE_EXHAUSTED: Ran out of memory on HBM (fake)"


@pytest.fixture
def fake_tpu(monkeypatch):
  """A reference forward that needs 900 MiB of temporaries at the
  compiler's default (out of HBM) and `budget` MiB under a budget of at
  least 100 MiB (refused below); budgets as a TPU mesh would take them."""
  tried = []

  def compile_ref_logp(cfg, model_cfg, mesh, rows):
    budget = cfg.score_temp_budget_mib
    tried.append(budget)
    if budget == 0 or budget < 100:
      raise RuntimeError(OOM)
    return program_lib.Program(
      "ref_logp", 50 * MIB, 0, 0, budget * MIB, 0, 0.0, 0.0, [],
      rows=rows, temp_budget_mib=budget,
    )  # fmt: skip

  monkeypatch.setattr(aot.scoring, "compile_ref_logp", compile_ref_logp)
  monkeypatch.setattr(
    aot.ts, "compiler_options", lambda mib, mesh: {"budget": mib}
  )
  return tried


def _run(fit_bytes, progress=None, **overrides):
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    batch_size=2,
    group_size=2,
    micro_batches=1,
    steps=1,
    **overrides,
  )
  mesh = mesh_lib.make_mesh(1, -1, 1)
  return aot.compile_run(
    cfg,
    objective.loss_fn,
    mesh,
    programs=("ref_logp",),
    hbm_bytes=1 << 40,
    fit_bytes=fit_bytes,
    progress=progress,
  )["ref_logp"]


def test_a_forward_out_of_hbm_at_the_default_is_compiled_under_a_budget(
  fake_tpu,
):
  """No program came back to read its arguments from: the first budget
  is the fit less what stays resident; a compile over the fit lowers it
  by the overshoot (the 50 MiB of arguments), and that one is kept."""
  prog = _run(1000 * MIB)
  resident = prog.resident_bytes
  first = (1000 * MIB - resident) >> 20
  assert fake_tpu == [0, first, first - 50], fake_tpu
  assert prog.temp_budget_mib == first - 50
  assert prog.peak_bytes <= 1000 * MIB
  assert prog.resident_bytes == resident > 0


def test_each_compile_and_retry_is_told_as_it_starts_and_ends(fake_tpu):
  """A 7B program compiles for minutes: a line as each compile starts, and
  one with its seconds, peak against the fit and rows per call (or why it
  failed)."""
  lines = []
  prog = _run(1000 * MIB, lines.append)
  first = (1000 * MIB - prog.resident_bytes) >> 20  # the fit less resident
  peak = lambda mib: f"{(prog.resident_bytes + (50 + mib) * MIB) / GIB:.2f}"
  fit = f"{1000 * MIB / GIB:.2f}"
  expected = [
    "ref_logp: compiling",
    f"ref_logp: failed in # s: {OOM}",
    f"ref_logp under --score_temp_budget_mib={first}: compiling",
    f"ref_logp under --score_temp_budget_mib={first}: # s, "
    f"peak {peak(first)} GiB of a {fit} GiB fit, over the fit, "
    f"{prog.rows} rows per call",
    f"ref_logp under --score_temp_budget_mib={first - 50}: compiling",
    f"ref_logp under --score_temp_budget_mib={first - 50}: # s, "
    f"peak {peak(first - 50)} GiB of a {fit} GiB fit, "
    f"{prog.rows} rows per call",
  ]
  assert prog.rows > 0
  host = r" \(this host's memory at its peak so far: [\d.]+ GB\)$"
  told = [re.sub(host, "", re.sub(r"\d+ s\b", "# s", x)) for x in lines]
  assert told == expected, lines
  assert all(re.search(host, x) for x in lines if "GiB" in x), lines
  # Without `progress`, nothing is told and the program is the same.
  assert _run(1000 * MIB) == prog


def test_a_budget_at_or_over_the_fit_is_planned_as_if_unset(fake_tpu):
  """A config's budget sized for another chip (ppo's PAPER preset names
  its v5p bound, 70 GiB, also on 32 GiB chips) bounds nothing the fit
  needs: the forward compiles at the default (out of HBM) and is budgeted
  as if the config set none. One under the fit is the config's to keep:
  compiled under it and not retried."""
  budgeted = _run(1000 * MIB)
  fake_tpu.clear()
  lines = []
  prog = _run(1000 * MIB, lines.append, score_temp_budget_mib=1000)
  first = (1000 * MIB - prog.resident_bytes) >> 20
  assert fake_tpu == [0, first, first - 50], fake_tpu
  assert prog == budgeted and prog.run_flags == {}, prog
  assert lines[0] == (
    "ref_logp: --score_temp_budget_mib=1000 is over the 0.98 GiB fit: at "
    "the compiler's default"
  ), lines
  fake_tpu.clear()
  # Under the fit (980 of a 1000 MiB fit, over once the 50 MiB of
  # arguments are added): the config's bound, kept.
  kept = _run(1000 * MIB, score_temp_budget_mib=980)
  assert fake_tpu == [980], fake_tpu
  assert kept.temp_budget_mib == 980 and kept.peak_bytes > 1000 * MIB


def test_a_program_that_fits_at_the_default_names_it_in_the_run():
  """A budget over the fit dropped, and the default fits: the run's flags
  say --train_temp_budget_mib=0 (the config's value is for another
  chip), and the summary says why. Without a fit checked (a local mesh),
  the config's flag is the program's."""
  tried = []

  def step(c):
    tried.append(c.train_temp_budget_mib)
    return program_lib.Program(
      "train_step", 10 * MIB, 0, 0, 100 * MIB, 0, 0.0, 0.0, [],
      temp_budget_mib=c.train_temp_budget_mib,
    )  # fmt: skip

  mesh = mesh_lib.make_mesh(1, -1, 1)
  cfg = dataclasses.replace(grpo.TinyConfig(), train_temp_budget_mib=500)
  compiler = retry.Retrying(
    {"train_step": step}, {"train_step": 0}, mesh, 400 * MIB
  )
  prog = compiler.compile_one("train_step", cfg)
  assert tried == [0] and prog.temp_budget_mib == 0, tried
  assert prog.run_flags == {"train_temp_budget_mib": 0}, prog
  text = report.text(
    summary.summarize({"train_step": prog}, cfg, aot.model_config(cfg),
                      hbm_bytes=GIB, devices=1, peak_flops=1e12,
                      hbm_bandwidth=1e11)
  )  # fmt: skip
  assert "at --train_temp_budget_mib=0: the compiler's default" in text, text
  # At 400 MiB (the fit, to the byte): over nothing it could bound.
  tried.clear()
  cfg = dataclasses.replace(cfg, train_temp_budget_mib=400)
  kept = compiler.compile_one("train_step", cfg)
  assert kept.run_flags == {"train_temp_budget_mib": 0}, tried
  assert tried == [0], tried
  tried.clear()
  cfg = dataclasses.replace(cfg, train_temp_budget_mib=399)
  assert compiler.compile_one("train_step", cfg).run_flags == {}
  assert tried == [399], tried
  local = retry.Retrying({"train_step": step}, {"train_step": 0}, mesh, None)
  tried.clear()
  cfg = dataclasses.replace(cfg, train_temp_budget_mib=500)
  assert local.compile_one("train_step", cfg).temp_budget_mib == 500
  assert tried == [500], tried


def test_a_forward_no_budget_holds_keeps_the_compilers_refusal(fake_tpu):
  """Room for less than the 100 MiB the fake needs: the error names the
  default's refusal and the budget's."""
  resident = _run(1000 * MIB).resident_bytes
  fake_tpu.clear()
  err = _run(resident + 60 * MIB)  # a 60 MiB budget: refused
  assert isinstance(err, RuntimeError), err
  assert str(err).startswith(OOM), err
  assert "with --score_temp_budget_mib=" in str(err), err
  assert fake_tpu == [0, 60], fake_tpu


def test_a_budget_the_compiler_refuses_keeps_the_first_program():
  first = program_lib.Program(
    "train_step", 10 << 20, 0, 0, 300 << 20, 0, 0, 0, []
  )

  def refuse(mib):
    raise RuntimeError(f"RESOURCE_EXHAUSTED: {mib} MiB is too little\nmore")

  kept = retry.budgeted(first, 110 << 20, refuse)
  assert kept.temp_bytes == first.temp_bytes and kept.temp_budget_mib == 0
  assert kept.note == (
    "with --train_temp_budget_mib=100: RESOURCE_EXHAUSTED: 100 MiB is too "
    "little"
  )
  # Nothing left for temporaries: no second compile.
  assert retry.budgeted(first, 5 << 20, refuse) is first


def test_a_budget_refused_by_a_little_is_tried_once_lower():
  """libtpu refuses a bound near what the program uses unbounded by a
  little (laser's reference forward on v5e-16: 12.45G of 12.36G) and
  compiles under a tighter one: the budget lowered by the shortfall and a
  sixteenth, once. A refusal short by a quarter of the budget or more (a
  floor) is not tried again, nor a second refusal, nor a train step's."""

  def refusal(need, have):
    return RuntimeError(
      "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. the total "
      f"memory required for HLO temporaries ({need}) exceeds available HBM "
      f"({have}).\nmore"
    )

  assert program_lib.shortfall(str(refusal("12.45G", "12.36G"))) == int(
    12.45 * (1 << 30) - 12.36 * (1 << 30)
  )
  assert program_lib.shortfall(str(refusal("100.75M", "73.00M"))) == int(
    100.75 * (1 << 20) - 73 * (1 << 20)
  )
  oom = (  # simplerl_zoo's 7B train step on v5e-32 under 13472 MiB
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile "
    "permanent error. Ran out of memory in memory space hbm. Used 13.75G of "
    "13.16G hbm. Exceeded hbm capacity by 605.18M."
  )
  assert program_lib.shortfall(oom) == int(
    13.75 * (1 << 30) - 13.16 * (1 << 30)
  )
  assert program_lib.shortfall("RESOURCE_EXHAUSTED: 100 MiB is too little") == 0
  first = program_lib.Program(
    "ref_logp", 10 << 20, 0, 0, 300 << 20, 0, 0, 0, []
  )
  budgets = []

  def near(mib):  # needs 2 MiB more than a bound of 100 MiB or more
    budgets.append(mib)
    if mib >= 100:
      raise refusal(f"{mib + 2}.00M", f"{mib}.00M")
    return program_lib.Program(
      "ref_logp", 10 << 20, 0, 0, (mib - 5) << 20, 0, 0, 0, [],
      temp_budget_mib=mib,
    )  # fmt: skip

  # 110 MiB fit - 10 MiB of arguments: 100; refused 2 MiB short, then
  # 100 - 2 - 100 // 16 = 92 compiles (87 MiB of temporaries).
  kept = retry.budgeted(first, 110 << 20, near)
  assert budgets == [100, 92], budgets
  assert kept.temp_budget_mib == 92 and kept.note == "", kept
  assert kept.temp_bytes == 87 << 20
  budgets.clear()

  def floor(mib):  # 160 MiB whatever the bound
    budgets.append(mib)
    raise refusal("160.00M", f"{mib}.00M")

  kept = retry.budgeted(first, 110 << 20, floor)
  assert budgets == [100], budgets
  assert kept.temp_bytes == first.temp_bytes and kept.temp_budget_mib == 0
  assert kept.note.startswith("with --score_temp_budget_mib=100: "), kept
  budgets.clear()

  def always(mib):  # 2 MiB short under any bound: lowered once only
    budgets.append(mib)
    raise refusal(f"{mib + 2}.00M", f"{mib}.00M")

  kept = retry.budgeted(first, 110 << 20, always)
  assert budgets == [100, 92], budgets
  assert kept.note.startswith("with --score_temp_budget_mib=92: "), kept
  # A train step's refusal, however near, is not tried lower (a floor).
  budgets.clear()
  step = dataclasses.replace(first, name="train_step")
  kept = retry.budgeted(step, 110 << 20, near)
  assert budgets == [100], budgets
  assert kept.note.startswith("with --train_temp_budget_mib=100: "), kept


def test_a_budgeted_compile_over_the_fit_is_tried_lower_by_its_overshoot():
  def prog(temp_mib):
    return program_lib.Program(
      "rollout", 10 << 20, 0, 0, temp_mib << 20, 0, 0, 0, []
    )

  budgets = []

  def compile_with(mib):  # lands 30 MiB over its budget, then 10 under
    budgets.append(mib)
    return prog(mib + 30 if len(budgets) == 1 else mib - 10)

  # 200 MiB fit - 10 MiB of arguments: 190 MiB; 220 lands 30 MiB over.
  kept = retry.budgeted(prog(300), 200 << 20, compile_with)
  assert budgets == [190, 160], budgets
  assert kept.temp_bytes == 150 << 20 and kept.peak_bytes <= 200 << 20
  # Over by more each time: three compiles, the last kept (still over).
  budgets.clear()

  def creeping(mib):
    budgets.append(mib)
    return prog(mib + 30 + 10 * len(budgets))

  kept = retry.budgeted(prog(300), 200 << 20, creeping)
  assert budgets == [190, 150, 140], budgets
  assert kept.temp_bytes == 200 << 20 and kept.peak_bytes > 200 << 20


def test_a_rollout_over_the_fit_is_tried_at_the_rows_its_room_holds():
  """retry.fewer_rows: a rollout of 1000 MiB of weights and 10 MiB per row
  at 64 rows (1640 MiB) over a 1500 MiB fit is compiled again at the rows
  the 500 MiB of room holds, 50, down to a multiple of the 8 batch shards
  (halving would try 32). With 300 MiB more that do not grow with the
  rows and 5 MiB per row, that first try (48) misses; the line through
  the two peaks says 40. However little room: half, down to a quarter (a
  fit below the weights: 32, then 16)."""
  mesh = mesh_lib.make_mesh(1, -1, 1)
  assert mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES) == 8
  tried, per_row, extra = [], [10], [0]

  def rollout(c):
    rows = c.rollout_rows or 64
    tried.append(rows)
    return program_lib.Program(
      "rollout", 1000 * MIB, (extra[0] + per_row[0] * rows) * MIB, 0, 0, 0,
      0.0, 0.0, [], rows=rows,
    )  # fmt: skip

  cfg = grpo.TinyConfig()
  for fit, grows, fixed, want in (
    (1500, 10, 0, [64, 48]),
    (1500, 5, 300, [64, 48, 40]),
    (900, 10, 0, [64, 32, 16]),
  ):
    tried.clear()
    per_row[0], extra[0] = grows, fixed
    compiler = retry.Retrying({"rollout": rollout}, {"rollout": 0}, mesh,
                              fit * MIB)  # fmt: skip
    got = compiler.fewer_rows(compiler.compile_one("rollout", cfg), cfg)
    assert tried == want, (fit, tried)
    assert got.rows == want[-1] and got.run_flags == {"rollout_rows": got.rows}
  # --rollout_tensor=4: the sampler's (1, 2, 4) mesh splits rows 2 ways, so
  # the 500 MiB of room's 50 rows are tried as they are.
  tried.clear()
  per_row[0], extra[0] = 10, 0
  compiler = retry.Retrying({"rollout": rollout}, {"rollout": 0}, mesh,
                            1500 * MIB)  # fmt: skip
  split = dataclasses.replace(cfg, rollout_tensor=4)
  got = compiler.fewer_rows(compiler.compile_one("rollout", split), split)
  assert tried == [64, 50] and got.rows == 50, tried
  # Told: the loop's own rows after the first compile's peak; the retry's
  # line names its rows once, in its own text.
  lines = []
  compiler = retry.Retrying({"rollout": rollout}, {"rollout": 0}, mesh,
                            1500 * MIB, lines.append)  # fmt: skip
  compiler.fewer_rows(compiler.compile_one("rollout", cfg), cfg)
  ends = [x for x in lines if not x.endswith(": compiling")]
  assert ends[0].startswith("rollout: ") and ", 64 rows per call (" in ends[0]
  assert ends[1].startswith("rollout at 48 rows per call: "), ends
  assert ends[1].count("rows per call") == 1, ends


def test_a_rollout_budget_the_compiler_refused_is_not_tried_again(
  monkeypatch,
):
  """A rollout over the fit whose budget the compiler refuses (libtpu
  counts more temporaries than any room the fit leaves) is compiled
  again at fewer rows without one; where it compiles, each try is
  budgeted; a fit that leaves no room tries none and refuses nothing."""
  monkeypatch.setattr(
    aot.ts, "compiler_options", lambda mib, mesh: {"budget": mib}
  )
  mesh = mesh_lib.make_mesh(1, -1, 1)
  tried, refuse = [], [True]

  def rollout(c):
    rows, budget = c.rollout_rows or 64, c.rollout_temp_budget_mib
    tried.append((rows, budget))
    if budget and refuse[0]:
      raise RuntimeError(OOM)
    temp = 300 + 5 * rows  # MiB: 300 do not grow with the rows
    temp = min(budget, temp) if budget else temp
    return program_lib.Program(
      "rollout", 1000 * MIB, 0, 0, temp * MIB, 0, 0.0, 0.0, [], rows=rows,
      temp_budget_mib=budget,
    )  # fmt: skip

  cfg = grpo.TinyConfig()
  for refused in (True, False):
    tried.clear()
    refuse[0] = refused
    compiler = retry.Retrying(
      {"rollout": rollout}, {"rollout": 0}, mesh, 1500 * MIB
    )
    got = compiler.fewer_rows(compiler.compile_one("rollout", cfg), cfg)
    if refused:  # 64 over, its budget refused; 48 over, 40 fit
      assert tried == [(64, 0), (64, 500), (48, 0), (40, 0)], tried
      assert compiler.refused == {"rollout"}
      assert got.rows == 40 and got.temp_budget_mib == 0
    else:  # the budget holds it at 64 rows: no fewer rows
      assert tried == [(64, 0), (64, 500)], tried
      assert compiler.refused == set() and got.temp_budget_mib == 500
  # A fit below the weights leaves no room for any budget: none is tried,
  # and none counts as refused.
  tried.clear()
  compiler = retry.Retrying(
    {"rollout": rollout}, {"rollout": 0}, mesh, 900 * MIB
  )
  compiler.compile_one("rollout", cfg)
  assert tried == [(64, 0)] and compiler.refused == set()


def test_a_replicated_rollout_over_the_fit_is_tried_split_over_fsdp():
  """retry.sharded_params: a rollout whose replicated weights (1000 MiB
  per chip here) leave it over an 800 MiB fit is compiled again with
  --rollout_layout=fsdp (300 MiB), and the run needs that flag; a layout
  that does not lower the peak keeps the first program, and a fit is
  not compiled again. aot._replicates says when the auto layout chose
  replicated weights (the only case worth the retry)."""
  mesh = mesh_lib.make_mesh(1, -1, 1)
  layouts, weights = [], {"auto": 1000, "fsdp": 300}

  def rollout(c):
    layouts.append(c.rollout_layout)
    return program_lib.Program(
      "rollout", weights[c.rollout_layout] * MIB, 0, 0, 0, 0, 0.0, 0.0, [],
      rows=8,
    )  # fmt: skip

  compiler = retry.Retrying(
    {"rollout": rollout}, {"rollout": 0}, mesh, 800 * MIB
  )
  cfg = grpo.TinyConfig()
  first = compiler.compile_one("rollout", cfg)
  got = compiler.sharded_params(first, cfg, fewer_rows=False)
  assert layouts == ["auto", "fsdp"], layouts
  assert got.run_flags == {"rollout_layout": "fsdp"}, got.run_flags
  assert got.argument_bytes == 300 * MIB
  weights["fsdp"] = 1200  # no lower: the first is kept
  assert compiler.sharded_params(first, cfg, fewer_rows=False) is first
  layouts.clear()
  assert compiler.sharded_params(got, cfg) is got and layouts == []
  model_cfg = aot.model_config(cfg)
  gib = 1 << 30
  assert aot._replicates(cfg, model_cfg, mesh, 16 * gib)  # tiny: fits
  fsdp = dataclasses.replace(cfg, rollout_layout="fsdp")
  assert not aot._replicates(fsdp, model_cfg, mesh, 16 * gib)
  assert not aot._replicates(cfg, model_cfg, mesh, 1)  # auto splits itself
  # On the sampler's own mesh (--rollout_tensor): split 4 ways, weights
  # that would take 80% of a chip whole take 20%, and are replicated over
  # its fsdp axis of 2; split 8 ways there is no fsdp axis to replicate over.
  param_bytes = model_cfg.num_params() * plan_state.compute_bytes(model_cfg)
  hbm = int(param_bytes / (2 * mesh_lib.ROLLOUT_PARAM_FRACTION))
  assert not aot._replicates(cfg, model_cfg, mesh, hbm)
  for tensor, want in ((4, True), (8, False)):
    split = dataclasses.replace(cfg, rollout_tensor=tensor)
    assert aot._replicates(split, model_cfg, mesh, hbm) is want, tensor


def _growing_rollout(tried, peak_mib, fail=()):
  """A fake rollout compile: 1000 MiB of weights (arguments) and the rest
  of `peak_mib(rows)` as outputs; out of HBM at the rows in `fail`."""

  def rollout(c):
    rows = c.rollout_rows or 64
    tried.append(rows)
    if rows in fail:
      raise RuntimeError(OOM)
    return program_lib.Program(
      "rollout", 1000 * MIB, (peak_mib(rows) - 1000) * MIB, 0, 0, 0, 0.0,
      0.0, [], rows=rows,
    )  # fmt: skip

  return rollout


def test_a_rollout_with_room_to_spare_is_tried_at_the_rows_the_fit_holds():
  """retry.more_rows: 1000 MiB of weights and 10 MiB per row fit a 2000
  MiB fit at the estimate's 64 rows (1640 MiB); the line through (0, 1000)
  and that peak meets the fit at 100 rows: 96 (8 batch shards) are
  compiled, fit, and are kept with --rollout_rows=96. Capped by the rows
  the run takes (80). Rows that grow faster than the line (96 over the
  fit) are tried once more where the two peaks' line meets it (72); out
  of HBM at 96, that line says 64 again: the first is kept. A rollout
  over the fit, or already at fewer rows or under a budget, is kept."""
  mesh = mesh_lib.make_mesh(1, -1, 1)
  cfg = grpo.TinyConfig()
  linear = lambda r: 1000 + 10 * r
  steeper = lambda r: linear(r) + 25 * max(0, r - 64)
  for peak_mib, most, fail, want, kept in (
    (linear, 512, (), [64, 96], 96),
    (linear, 80, (), [64, 80], 80),
    (steeper, 512, (), [64, 96, 72], 72),
    (linear, 512, (96,), [64, 96], 64),
  ):
    tried = []
    compiler = retry.Retrying(
      {"rollout": _growing_rollout(tried, peak_mib, fail)},
      {"rollout": 0},
      mesh,
      2000 * MIB,
    )
    first = compiler.compile_one("rollout", cfg)
    got = compiler.more_rows(first, cfg, most)
    assert tried == want, (most, tried)
    assert got.rows == kept and got.peak_bytes <= 2000 * MIB
    assert got.run_flags == ({"rollout_rows": kept} if kept != 64 else {})
  tried = []
  compiler = retry.Retrying(
    {"rollout": _growing_rollout(tried, linear)}, {"rollout": 0}, mesh,
    1500 * MIB,
  )  # fmt: skip
  over_fit = compiler.compile_one("rollout", cfg)
  assert compiler.more_rows(over_fit, cfg, 512) is over_fit
  fit = dataclasses.replace(over_fit, resident_bytes=0, output_bytes=0)
  for done in (
    dataclasses.replace(fit, run_flags={"rollout_rows": 64}),
    dataclasses.replace(fit, temp_budget_mib=900),
  ):
    assert compiler.more_rows(done, cfg, 512) is done
  assert tried == [64]


def test_the_planners_most_rows_are_what_the_run_takes(monkeypatch):
  """plan/rollout.rows_for with ESTIMATE_OVERCOUNT (the cap of
  retry.more_rows) is the most --rollout_rows rollout_memory.call_rows
  takes on the same free memory: those rows are taken (with a warning),
  one batch shard more is refused."""
  cfg = dataclasses.replace(
    grpo.TinyConfig(), max_prompt_len=16, max_new_tokens=112, batch_size=64
  )
  mesh = mesh_lib.make_mesh(1, -1, 1)
  model_cfg = aot.model_config(cfg)
  hbm, resident = 6 * MIB, MIB
  unit = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
  most = plan_rollout.rows_for(
    cfg, model_cfg, mesh, hbm, resident,
    overcount=rollout_memory.ESTIMATE_OVERCOUNT,
  )  # fmt: skip
  sized = plan_rollout.rows_for(cfg, model_cfg, mesh, hbm, resident)
  assert sized < most < cfg.num_sequences, (sized, most)
  params = plan_state.per_device_bytes(
    plan_state.rollout_params(model_cfg, mesh, hbm)
  )
  free = hbm - resident - params
  monkeypatch.setattr(devices, "device_free_memory", lambda mesh: free)
  take = lambda rows: rollout_memory.call_rows(
    rows, cfg.num_sequences, model_cfg, cfg.max_prompt_len,
    cfg.max_new_tokens, mesh, None, cfg.rollout_batching,
  )  # fmt: skip
  assert take(0) == sized
  assert take(most) == most
  with pytest.raises(ValueError, match=f"--rollout_rows={most + unit}"):
    take(most + unit)


def test_compile_run_tries_more_rows_up_to_what_the_run_takes(monkeypatch):
  """aot.compile_run(more_rows=True): a rollout that fits at the rows its
  estimate sizes for a 6 MiB chip is compiled again at the most rows the
  run would take there (rows_for with ESTIMATE_OVERCOUNT; the fake's
  peak line would hold 400), with --rollout_rows; without more_rows, or
  with rows given, once."""
  cfg = dataclasses.replace(
    grpo.TinyConfig(), max_prompt_len=16, max_new_tokens=112, batch_size=64
  )
  mesh = mesh_lib.make_mesh(1, -1, 1)
  tried = []

  def compile_rollout(c, model_cfg, mesh, rows, hbm_bytes):
    tried.append(rows)
    return program_lib.Program(
      "rollout", 1000 * MIB, rows * MIB, 0, 0, 0, 0.0, 0.0, [], rows=rows
    )

  monkeypatch.setattr(aot.rollout_lib, "compile_rollout", compile_rollout)
  hbm = 6 * MIB
  run = lambda c, **kw: aot.compile_run(
    c, objective.loss_fn, mesh, programs=("rollout",), hbm_bytes=hbm,
    fit_bytes=1400 * MIB, **kw,
  )["rollout"]  # fmt: skip
  got = run(cfg, more_rows=True)
  sized, most = tried
  resident = plan_state.resident_bytes(cfg, aot.model_config(cfg), mesh)
  assert most == plan_rollout.rows_for(
    cfg, aot.model_config(cfg), mesh, hbm, resident["rollout"],
    overcount=rollout_memory.ESTIMATE_OVERCOUNT,
  )  # fmt: skip
  assert sized < most < 400
  assert got.rows == most and got.run_flags == {"rollout_rows": most}
  for c in (cfg, dataclasses.replace(cfg, rollout_rows=8)):
    tried.clear()
    assert run(c).run_flags == {} and len(tried) == 1
  tried.clear()
  run(dataclasses.replace(cfg, rollout_rows=8), more_rows=True)
  assert tried == [8]


def test_a_train_step_over_the_fit_is_tried_in_more_micro_batches(monkeypatch):
  """retry.more_micro_batches through aot.compile_run: a train step of 100
  MiB plus 1 MiB per row of its micro-batch, 128 rows over 8 batch shards,
  against a 150 MiB fit: 1 and 2 micro-batches miss, 4 (132 MiB) fit and
  are kept with --micro_batches=4, and the reference forward after it
  scores 4 micro-batches' rows (32) as that run would. Doubling stops
  after three tries (a 105 MiB fit: 8 micro-batches kept over it) and
  where a micro-batch's rows would not split over the shards (24 rows:
  12 per micro-batch over 8 shards)."""
  mesh = mesh_lib.make_mesh(1, -1, 1)
  assert mesh_lib.batch_divisor(mesh) == 8
  tried, scored = [], []

  def compile_train_step(c, model_cfg, mesh, *args):
    tried.append(c.micro_batches)
    rows = c.num_sequences // c.micro_batches
    return program_lib.Program(
      "train_step", 0, 0, 0, (100 + rows) * MIB, 0, 0.0, 0.0, []
    )

  def compile_ref_logp(c, model_cfg, mesh, rows):
    scored.append((c.micro_batches, rows))
    return program_lib.Program("ref_logp", 0, 0, 0, MIB, 0, 0.0, 0.0, [])

  monkeypatch.setattr(aot.training, "compile_train_step", compile_train_step)
  monkeypatch.setattr(aot.scoring, "compile_ref_logp", compile_ref_logp)
  cfg = dataclasses.replace(
    grpo.TinyConfig(), batch_size=16, group_size=8, micro_batches=1, steps=1
  )
  assert cfg.num_sequences == 128 and cfg.minibatches == 1
  run = lambda c, fit: aot.compile_run(
    c, objective.loss_fn, mesh, programs=("train_step", "ref_logp"),
    hbm_bytes=1 << 40, fit_bytes=fit * MIB,
  )  # fmt: skip
  got = run(cfg, 150)
  assert tried == [1, 2, 4] and scored == [(4, 32)], (tried, scored)
  assert got["train_step"].run_flags == {"micro_batches": 4}
  assert got["train_step"].temp_bytes == 132 * MIB
  tried.clear()
  got = run(cfg, 105)
  assert tried == [1, 2, 4, 8], tried
  assert got["train_step"].run_flags == {"micro_batches": 8}
  assert retry.over(got["train_step"], 105 * MIB)
  tried.clear()
  run(dataclasses.replace(cfg, batch_size=3), 105)
  assert tried == [1], tried
  tried.clear()
  run(cfg, 500)  # fits at once
  assert tried == [1], tried


def test_a_train_steps_doublings_are_budgeted_again(monkeypatch):
  """On a TPU (budgets taken) a step over the fit at the default is tried
  under a budget, and libtpu refuses budgets under what the step needs
  (60 MiB + 1 per row; the default holds 100 MiB beside the rows): 128
  rows in one micro-batch miss a 100 MiB fit and the budget that would
  hold them is refused; 2 micro-batches miss at the default and under
  that budget; 4 miss at the default and fit under it (the budget
  refused before is tried again): --micro_batches=4
  --train_temp_budget_mib=99, the note naming both refusals."""
  mesh = mesh_lib.make_mesh(1, -1, 1)
  tried = []

  def compile_train_step(c, model_cfg, mesh, *args):
    budget = c.train_temp_budget_mib
    tried.append((c.micro_batches, budget))
    rows = c.num_sequences // c.micro_batches
    if budget and budget < 60 + rows:
      raise RuntimeError(OOM)
    return program_lib.Program(
      "train_step", 0, 0, 0, (budget or 100 + rows) * MIB, 0, 0.0, 0.0, [],
      temp_budget_mib=budget,
    )  # fmt: skip

  monkeypatch.setattr(aot.training, "compile_train_step", compile_train_step)
  monkeypatch.setattr(
    aot.ts, "compiler_options", lambda mib, mesh: {"budget": mib}
  )
  cfg = dataclasses.replace(
    grpo.TinyConfig(), batch_size=16, group_size=8, micro_batches=1, steps=1
  )
  got = aot.compile_run(
    cfg, objective.loss_fn, mesh, programs=("train_step",),
    hbm_bytes=1 << 40, fit_bytes=100 * MIB,
  )["train_step"]  # fmt: skip
  assert tried == [(1, 0), (1, 99), (2, 0), (2, 99), (4, 0), (4, 99)], tried
  assert got.run_flags == {"micro_batches": 4} and got.temp_budget_mib == 99
  assert not retry.over(got, 100 * MIB)
  # Both refusals are noted: at the config's micro-batch and in two.
  refused = "with --train_temp_budget_mib=99: RESOURCE_EXHAUSTED"
  assert got.note.startswith(refused), got.note
  assert f"; in 2 micro-batches {refused}" in got.note, got.note
