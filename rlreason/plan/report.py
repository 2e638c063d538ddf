"""A plan's summary as text: the verdict, each program's bytes, why the
planner set a flag the config did not, the roofline and the advice.

  print(report.text(summary.summarize(programs, cfg, model_cfg, ...)))
"""

from rlreason.plan import program as program_lib
from rlreason.plan.summary import FIT_MARGIN, GIB, Summary


def _loops(trips) -> str:
  """How the bytes count loops: "loops x8, x32 multiplied out"; a loop
  whose trip count was not read (0: a sampler's decode loop, which stops
  when every row has) is counted once, its time the roofline's own."""
  known = [f"x{n}" for n in trips if n]
  unread = len(trips) - len(known)
  parts = [f"loops {', '.join(known)} multiplied out"] if known else []
  if unread:
    parts.append(
      f"{unread} loop{'s' * (unread > 1)} of unread trip count counted once"
    )
  return "; ".join(parts) or "no loops"


# Why the planner set a flag the config did not (Program.run_flags).
RUN_FLAGS = {
  "rollout_rows": "other rows per call than the loop would size from free "
  "memory (its estimate)",
  "micro_batches": "more micro-batches than the config's (the train step "
  "over the fit in fewer)",
  "rm_micro_batches": "more Bradley-Terry micro-batches than the config's",
  "rollout_layout": "the rollout's parameters split over fsdp (replicated, "
  "they leave too little room)",
  **{
    flag: "the compiler's default bound on temporaries (the config's is "
    "over this chip's fit: a bound sized for another chip)"
    for flag in program_lib.TEMP_BUDGETS.values()
  },
}


def text(s: Summary, title: str = "") -> str:
  lines = [title] if title else []
  verdict = "fits" if s.fits else "does NOT fit"
  lines.append(
    f"{verdict}: peak {s.peak_bytes / GIB:.2f} GiB of {s.hbm_bytes / GIB:.0f}"
    f" GiB per chip ({100 * s.margin:.0f}% free; needs "
    f">= {100 * FIT_MARGIN:.0f}%)"
  )
  for name, p in s.programs.items():
    rows = f" ({p.rows} rows per call)" if p.rows else ""
    lines.append(
      f"  {name:10s} peak {p.peak_bytes / GIB:7.2f} GiB = resident "
      f"{p.resident_bytes / GIB:.2f} + args "
      f"{p.argument_bytes / GIB:.2f} + out {p.output_bytes / GIB:.2f} - "
      f"alias {p.alias_bytes / GIB:.2f} + temp {p.temp_bytes / GIB:.2f}; "
      f"XLA-counted {p.flops / 1e12:.1f} TFLOP (a loop body once), "
      f"{p.bytes_accessed / 1e9:.1f} GB ({_loops(p.loop_trips)})"
      f"{rows}"
    )
    rows_bytes = p.output_bytes - p.alias_bytes + p.temp_bytes
    if p.estimate_bytes and rows_bytes > 0:
      lines.append(
        f"      its rows estimated at {p.estimate_bytes / GIB:.2f} GiB "
        f"(rollout_memory), compiled to {rows_bytes / GIB:.2f} GiB "
        f"(out - alias + temp): {p.estimate_bytes / rows_bytes:.2f}x"
      )
    if p.host_temp_bytes or p.host_copy_bytes:
      lines.append(
        f"      and {p.host_temp_bytes / GIB:.2f} GiB of temporaries in the "
        "host's memory (offloaded, not in the peak), "
        f"{p.host_copy_bytes / 1e9:.2f} GB copied out and back per call"
      )
    for flag, value in p.run_flags.items():
      lines.append(
        f"      at --{flag}={value}: {RUN_FLAGS[flag]}; the run needs the same"
      )
    if p.temp_budget_mib:
      flag = program_lib.TEMP_BUDGETS[name]
      lines.append(
        f"      compiled with --{flag}={p.temp_budget_mib}"
        " (libtpu's bound on its temporaries): the run needs the same"
      )
    if p.note:
      lines.append(f"      {p.note}")
    if p.kernels:
      lines.append(f"      kernels: {', '.join(p.kernels)}")
    for size, shape, op in p.largest[:10]:
      lines.append(f"      {size / GIB:8.3f} GiB  {shape}  {op}")
  lines.append(
    f"roofline RL step {s.step_seconds:.1f} s (train {s.train_seconds:.1f}"
    f" s), train MFU {100 * s.mfu:.0f}%"
  )
  if s.ici_seconds:
    each = ", ".join(
      f"{k} {v:.2f} s (of {s.programs[k].ici_bytes / 1e9:.2f} GB per call)"
      if k in s.programs
      else f"{k} {v:.2f} s"
      for k, v in s.ici_seconds.items()
    )
    lines.append(f"  ICI per RL step (at least, overlapped): {each}")
  if s.host_copy_bytes and s.train_seconds:
    lines.append(
      f"  host copies per RL step: {s.host_copy_bytes / 1e9:.2f} GB per chip"
      " (train_step, not in its time): hidden behind its roofline at >= "
      f"{s.host_copy_bytes / s.train_seconds / 1e9:.3f} GB/s per chip "
      "between chip and host"
    )
  if s.before_seconds:
    lines.append(
      f"before the RL (once): {s.before_seconds:.1f} s (reward_model_train)"
    )
  lines += [f"advice: {a}" for a in s.advice]
  return "\n".join(lines)
