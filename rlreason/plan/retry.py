"""A program over the fit compiled again as the run would be told to run it.

  compiler = retry.Retrying(makers, resident, mesh, fit_bytes)
  prog = compiler.compile_one("rollout", cfg)     # budgeted where needed
  prog = compiler.fewer_rows(prog, cfg)           # then fewer rows per call
  prog = compiler.more_rows(prog, cfg, most)      # or more, where it fits

aot.compile_run builds `makers` ({program: compile(config) -> Program}) and
what stays resident beside each program; this module decides what to try
when one lands over the fit (or out of HBM at the compiler's default):
  budgeted            under its temporaries budget flag (program.
                      TEMP_BUDGETS), lowered by each overshoot (a
                      forward's or rollout's, once by a refusal's
                      shortfall, where small); not
                      again once the compiler refused one (a rollout
                      at fewer rows);
  fewer_rows          a rollout at fewer sequences per call (where its
                      peaks so far meet the fit, at least half), down to
                      a quarter (--rollout_rows in the run);
  more_rows           a rollout that fits with room to spare at more
                      (where its peak's line meets the fit), as many as
                      the run takes (--rollout_rows in the run);
  more_micro_batches  a train step or a Bradley-Terry step in twice the
                      micro-batches, up to three times, each still split
                      over the batch shards (--micro_batches,
                      --rm_micro_batches in the run);
  sharded_params      a rollout whose replicated parameters leave too
                      little room, with them split over fsdp as in
                      training (--rollout_layout=fsdp in the run).
A fit found by a retry records the flag the run needs
(Program.temp_budget_mib, Program.run_flags).
"""

import dataclasses
import time
from typing import Callable

from rlreason import mesh as mesh_lib
from rlreason.plan import program as program_lib
from rlreason.plan.summary import GIB
from rlreason.sampling import tree_loop
from rlreason.train import train_step as ts

# The config field each step program accumulates its gradient over.
MICRO_BATCH_FLAGS = {
  "train_step": "micro_batches",
  "reward_model_train": "rm_micro_batches",
}


def budgeted(
  first: program_lib.Program, fit_bytes: int, compile_with, tries: int = 3
):
  """A program (train step, rollout) again under its budget flag
  (program.TEMP_BUDGETS): first the temporaries that leave its peak
  (resident, arguments, outputs, code) at `fit_bytes`. libtpu's count of
  temporaries is not memory_analysis's (a 7B rollout for v5e-32 under a
  7000 MiB budget: 8.04 GiB of temporaries), so a compile that lands over
  the fit is tried again with the budget lowered by the overshoot, up to
  `tries` compiles; the last is kept. `compile_with(budget_mib)` compiles;
  when the compiler cannot (out of memory), the last program is kept with
  a note of why. A forward's or a rollout's refusal short by less than a
  quarter of the budget is tried once more, lower by the shortfall and a
  sixteenth: under a bound near what it would use unbounded, libtpu's
  count lands just over it, and a tighter one compiles (laser's 1.5B
  reference forward, 32 rows of 17k tokens on v5e-16: refused at 12653
  MiB, needing 12.45 GiB of 12.36; compiled at 12000 MiB with 11.94 GiB
  of temporaries, at 9000 with 7.97). A step's (MICRO_BATCH_FLAGS) is
  not: each refusal seen was a floor, near or not (expert_iteration's 7B
  train step on v5e-16: 10.71 GiB under 8989 MiB, 10.72 under 6451; in
  64 micro-batches 9.19 under 8981, 9.16 under 7989; ghpo's 9.67 under
  both 6618 and 3300)."""
  room = fit_bytes - (first.peak_bytes - first.temp_bytes)
  if room <= 0:
    return first
  budget, kept = room >> 20, first
  # A step's refusals are floors; a forward's or rollout's is lowered once.
  lowered = first.name in MICRO_BATCH_FLAGS
  for _ in range(tries):
    try:
      kept = dataclasses.replace(
        compile_with(budget), resident_bytes=first.resident_bytes
      )
    except Exception as e:  # noqa: BLE001 - the compiler's own OOM
      short = program_lib.shortfall(str(e))
      if not lowered and 0 < short < (budget << 20) // 4:
        lowered = True
        budget -= -(-short >> 20) + budget // 16
        continue
      why = str(e).splitlines()[0][:200]
      flag = program_lib.TEMP_BUDGETS[first.name]
      return dataclasses.replace(kept, note=f"with --{flag}={budget}: {why}")
    overshoot = kept.peak_bytes - fit_bytes
    budget -= -(-overshoot >> 20)  # MiB, rounded up
    if overshoot <= 0 or budget <= 0:
      break
  return kept


def over(prog, fit_bytes: int) -> bool:
  """Whether a compile's result (a Program, or the exception it raised)
  misses the fit."""
  if not isinstance(prog, program_lib.Program):
    return True  # did not compile
  return prog.peak_bytes > fit_bytes


def _at_fit(seen, fit_bytes: int, fixed: int) -> int:
  """Rows per call where the line through the last two compiled (rows,
  peak bytes) of `seen` meets the fit (with one, through (0, fixed): the
  resident arrays and the weights); 0 where the peak does not grow."""
  r1, p1 = seen[-1]
  r0, p0 = seen[-2] if len(seen) > 1 else (0, fixed)
  slope = (p1 - p0) / (r1 - r0) if r1 != r0 else 0.0
  return int(r1 - (p1 - fit_bytes) / slope) if slope > 0 else 0


def _fewer(seen, rows: int, fit_bytes: int, fixed: int, unit: int) -> int:
  """The next rows per call to try for a rollout over the fit, fewer than
  `rows` and at least half, a multiple of `unit`: where the peaks so far
  meet the fit (_at_fit)."""
  est = _at_fit(seen, fit_bytes, fixed)
  return max(rows // 2, min(est, rows - unit)) // unit * unit


@dataclasses.dataclass(frozen=True)
class Retrying:
  """Compiles a run's programs by name, retrying those over the fit.

  makers: {program: compile(config) -> Program}; resident: {program:
  bytes resident beside it}; fit_bytes: None where no fit is checked (a
  local mesh, or every budget flag given); progress: told a line as each
  compile starts and ends (a 7B program compiles for minutes)."""

  makers: dict
  resident: dict
  mesh: object
  fit_bytes: int | None
  progress: Callable[[str], None] | None = None
  # Programs whose first budget the compiler refused: not budgeted again
  # (a rollout at fewer rows: libtpu counted 14.2-14.8 GB of temporaries
  # for grpo's 7B at 188, 176 and 160 rows per call at --mesh_tensor=2,
  # under budgets of 5.7-5.9 GiB, memory_analysis 2.5 times fewer; none
  # of the 18 rollout budgets in this host's logs of 7B presets on 32 GiB
  # chips compiled, each refused in 11-29 s. Budgets that compile, as
  # grpo's on v5e-32, are tried again.)
  refused: set = dataclasses.field(default_factory=set)

  def _compile(self, name: str, c, how: str = "") -> program_lib.Program:
    """makers[name](c); `how` (" under --flag=N", ...) names the retry in
    the progress lines, which end with the seconds, the peak and a
    forward's or rollout's rows per call (where `how` does not name
    them: the rows the loop sized itself)."""
    if self.progress is None:
      return self.makers[name](c)
    self.progress(f"{name}{how}: compiling")
    t0 = time.time()
    try:
      prog = self.makers[name](c)
    except Exception as e:
      why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
      self.progress(f"{name}{how}: failed in {time.time() - t0:.0f} s: {why}")
      raise
    peak = prog.peak_bytes + self.resident.get(name, 0)
    verdict = ""
    if self.fit_bytes:
      over_fit = ", over the fit" if peak > self.fit_bytes else ""
      verdict = f" of a {self.fit_bytes / GIB:.2f} GiB fit{over_fit}"
    if prog.rows and "rows per call" not in how:
      verdict += f", {prog.rows} rows per call"
    host = program_lib.host_peak_gb()
    self.progress(
      f"{name}{how}: {time.time() - t0:.0f} s, peak {peak / GIB:.2f} GiB"
      f"{verdict} (this host's memory at its peak so far: {host:.1f} GB)"
    )
    return prog

  def compile_one(self, name: str, c, how: str = "") -> program_lib.Program:
    """`name` compiled with config `c`; over the fit, or out of HBM at the
    compiler's default, again under the temporaries budget where `c`
    sets none (program.TEMP_BUDGETS; or one at or over the fit) and the
    compiler has not refused one for `name` (self.refused)."""
    flag = program_lib.TEMP_BUDGETS.get(name)
    # A budget at or over the fit bounds nothing the fit needs: one sized
    # for another chip (ppo's and lp_reg's PAPER presets name their v5p
    # bound, 70 GiB, which on a 32 GiB chip left the train step out of
    # HBM at 128 micro-batches and unbudgeted). Compiled at the default
    # and budgeted as if unset; a program kept at the default says so in
    # the run's flags (--flag=0).
    foreign = bool(
      flag and self.fit_bytes and getattr(c, flag, 0) << 20 >= self.fit_bytes
    )
    if foreign:
      if self.progress is not None:
        self.progress(
          f"{name}{how}: --{flag}={getattr(c, flag)} is over the"
          f" {self.fit_bytes / GIB:.2f} GiB fit: at the compiler's default"
        )
      c = dataclasses.replace(c, **{flag: 0})
    kept = self._budgeted_one(name, c, how, flag)
    if foreign and not kept.temp_budget_mib:
      kept = dataclasses.replace(kept, run_flags={**kept.run_flags, flag: 0})
    return kept

  def _budgeted_one(self, name, c, how, flag) -> program_lib.Program:
    """compile_one once a budget over the fit is dropped from `c`."""
    can_budget = (
      flag
      and name not in self.refused
      and self.fit_bytes
      and not getattr(c, flag, 0)
      and ts.compiler_options(1, self.mesh)  # a TPU mesh
      # A tree rollout's jitted pieces compile without a budget.
      and not (name == "rollout" and tree_loop.call_shape(c))
    )
    with_budget = lambda mib: self._compile(
      name, dataclasses.replace(c, **{flag: mib}), f"{how} under --{flag}={mib}"
    )
    try:
      first = self._compile(name, c, how)
    except Exception as e:  # noqa: BLE001 - out of HBM at the default
      if not can_budget:
        raise
      # No program to read its arguments from: the first budget is the
      # fit less what stays resident, lowered by each overshoot.
      stub = program_lib.Program(
        name, 0, 0, 0, 0, 0, 0.0, 0.0, [], resident_bytes=self.resident[name]
      )
      kept = budgeted(stub, self.fit_bytes, with_budget)
      if kept.argument_bytes == 0:  # no budget compiled either
        self.refused.add(name)
        why = str(e).splitlines()[0][:200]
        raise RuntimeError(f"{why}; {kept.note}") from e
      return kept
    first = dataclasses.replace(first, resident_bytes=self.resident[name])
    if can_budget and first.peak_bytes > self.fit_bytes:
      kept = budgeted(first, self.fit_bytes, with_budget)
      if kept is not first and not kept.temp_budget_mib:  # tried, refused
        self.refused.add(name)
      return kept
    return first

  def fewer_rows(self, prog, cfg):
    """A rollout over the fit at the rows per call the loop would size
    itself (rollout_memory's estimate leaves out what the compiler holds
    beside the cache, e.g. gathered weights): again at fewer rows (_fewer:
    where the peaks compiled so far say the fit is, at least half), at
    most three times and down to a quarter of the rows and the batch
    shards (a tree rollout: the fewest whole prompts that split over
    them, tree_loop.call_prompts); a fit at fewer rows needs
    --rollout_rows in the run (Program.run_flags)."""
    unit = self._row_unit(cfg)
    rows, floor = prog.rows, prog.rows // 4  # two halvings at most
    seen = [(prog.rows, prog.peak_bytes)]
    fixed = prog.resident_bytes + prog.argument_bytes
    for _ in range(3):
      rows = _fewer(seen, rows, self.fit_bytes, fixed, unit)
      if not over(prog, self.fit_bytes) or rows < max(unit, floor):
        break
      c = dataclasses.replace(cfg, rollout_rows=rows)
      try:
        fewer = self.compile_one("rollout", c, f" at {rows} rows per call")
      except Exception:  # noqa: BLE001 - out of HBM at the default budget
        seen = [(rows, 2 * self.fit_bytes)]  # the next try: half as many
        continue
      seen.append((rows, fewer.peak_bytes))
      prog = dataclasses.replace(
        fewer, run_flags={**fewer.run_flags, "rollout_rows": rows}
      )
    return prog

  def _row_unit(self, cfg) -> int:
    """A rollout's rows per call split over the batch shards of the
    sampler's mesh (--rollout_tensor: mesh.rollout_mesh); a tree
    rollout's hold the fewest whole prompts' trees that split over them
    (tree_loop.call_prompts)."""
    unit = mesh_lib.batch_divisor(
      mesh_lib.rollout_mesh(self.mesh, getattr(cfg, "rollout_tensor", 0)),
      mesh_lib.ROLLOUT_RULES,
    )
    tree_shape = tree_loop.call_shape(cfg)
    if tree_shape:
      unit = tree_shape[0] * tree_loop.call_prompts(0, tree_shape[0], unit)
    return unit

  def more_rows(self, prog, cfg, most: int):
    """A rollout that fits, at the rows per call the loop would size from
    free memory (rollout_memory's estimate errs high: up to
    ESTIMATE_OVERCOUNT times the compiled bytes): again at the rows where
    the line through (0, resident + arguments) and its peak meets the fit,
    a multiple of the batch shards and at most `most` (what the run takes:
    rollout_memory.call_rows, at most N); a try over the fit (or out of
    HBM) once more where the line through the two peaks meets it. The most
    rows that fit are kept (--rollout_rows in the run, Program.run_flags):
    fewer calls, or more decode slots, each reading the weights once per
    decode step. A tree rollout's calls, and a rollout that needed a
    budget or fewer rows to fit, are kept as they are."""
    if (
      over(prog, self.fit_bytes)
      or tree_loop.call_shape(cfg)
      or prog.temp_budget_mib  # over the fit at the compiler's default
      or "rollout_rows" in prog.run_flags  # at fewer rows already
    ):
      return prog
    unit, kept = self._row_unit(cfg), prog
    fixed = prog.resident_bytes + prog.argument_bytes
    seen = [(prog.rows, prog.peak_bytes)]
    for _ in range(2):
      rows = min(_at_fit(seen, self.fit_bytes, fixed), most) // unit * unit
      if rows <= kept.rows or any(rows == r for r, _ in seen):
        break
      c = dataclasses.replace(cfg, rollout_rows=rows)
      try:
        more = self._compile("rollout", c, f" at {rows} rows per call")
      except Exception:  # noqa: BLE001 - out of HBM at these rows
        seen.append((rows, 2 * self.fit_bytes))
        continue
      more = dataclasses.replace(more, resident_bytes=prog.resident_bytes)
      seen.append((rows, more.peak_bytes))
      if over(more, self.fit_bytes):
        continue
      kept = dataclasses.replace(
        more, run_flags={**prog.run_flags, "rollout_rows": rows}
      )
      break
    return kept

  def sharded_params(self, prog, cfg, fewer_rows: bool = True):
    """A rollout still over the fit with its parameters replicated (the
    auto layout's choice where they take at most 40% of a chip,
    mesh.rollout_rules, which does not count the train state resident
    beside them): again with them split over fsdp, as the run's
    --rollout_layout=fsdp lays them out, the rows per call sized for the
    memory that frees (then halved as in fewer_rows unless `fewer_rows`
    is False: --rollout_rows given). Each decode step then all-gathers
    the weights over the ICI (Program.ici_bytes, in the roofline). Kept
    where it lowers the peak (Program.run_flags)."""
    if not over(prog, self.fit_bytes):
      return prog
    c = dataclasses.replace(cfg, rollout_layout="fsdp")
    try:
      sharded = self.compile_one("rollout", c, " with --rollout_layout=fsdp")
      if fewer_rows:
        sharded = self.fewer_rows(sharded, c)
    except Exception:  # noqa: BLE001 - out of HBM at the default budget
      return prog
    if isinstance(prog, program_lib.Program) and (
      sharded.peak_bytes >= prog.peak_bytes
    ):
      return prog
    return dataclasses.replace(
      sharded, run_flags={**sharded.run_flags, "rollout_layout": "fsdp"}
    )

  def more_micro_batches(self, prog, cfg, rows: int, name: str):
    """A step over the fit (or out of HBM), the train step or a
    Bradley-Terry step (`name`) of `rows` rows (pairs) per step: again in
    twice the micro-batches, up to three times, while each micro-batch
    still holds a row per batch shard (the train step's: a whole number
    per shard, else XLA keeps its activations whole on groups of chips,
    train_step.unsplit); a fit in more needs the flag in the run
    (MICRO_BATCH_FLAGS, Program.run_flags). Each compiles as compile_one
    does, at the default and over the fit under a budget; a train step's
    budget refused at fewer micro-batches is tried again (empo's 7B step
    on v5e-32 at 4 rows per chip: 16.84 GiB at the default, libtpu
    needing 10.47 GB of temporaries under a 10.40 GiB budget; at 2 rows
    12.87 GiB at the default). Each budget the compiler refused, at the
    config's micro-batches or more, says so in the kept program's note."""
    flag = MICRO_BATCH_FLAGS[name]
    unit = mesh_lib.batch_divisor(self.mesh)
    micro = getattr(cfg, flag, 1)
    for _ in range(3):
      micro *= 2
      each = rows // micro
      if (
        not over(prog, self.fit_bytes)
        or rows % micro
        or each < unit
        or (name == "train_step" and each % unit)
      ):
        break
      c = dataclasses.replace(cfg, **{flag: micro})
      if name == "train_step":  # fewer rows may take the budget refused
        self.refused.discard(name)
      try:
        more = self.compile_one(name, c, f" in {micro} micro-batches")
      except Exception:  # noqa: BLE001 - out of HBM
        continue
      notes = [n for n in (getattr(prog, "note", ""),) if n]
      if more.note:
        notes.append(f"in {micro} micro-batches {more.note}")
      prog = dataclasses.replace(
        more,
        run_flags={**more.run_flags, flag: micro},
        note="; ".join(notes),
      )
    return prog
