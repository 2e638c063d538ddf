"""A compiled program's per-device memory and cost, read from the compiler.

  prog = program.analyse("train_step", jitted.lower(*args).compile())
  prog.peak_bytes, prog.temp_bytes, prog.largest, prog.flops

`Program` is what plan/aot.py's compilers return and plan/summary.py
prints; `largest_buffers` reads the optimized HLO's ten largest arrays;
`shortfall` reads a refusal's bytes, `host_peak_gb` what a compile took
of this host.
"""

import dataclasses
import re
import resource
import sys

from rlreason.plan import hlo_loops
from rlreason.plan import hlo_text
from rlreason.sampling import continuous_loop


# The config field that bounds each program's temporaries on TPU (libtpu's
# xla_tpu_max_hbm_size_mib; Program.temp_budget_mib). Programs may share
# one (the whole-rollout forwards: Context.scoring): a run needs the
# smallest that any of them was planned under.
TEMP_BUDGETS = {
  "train_step": "train_temp_budget_mib",
  "critic_step": "train_temp_budget_mib",  # the run's step of its critic
  "rollout": "rollout_temp_budget_mib",
  "ref_logp": "score_temp_budget_mib",
  "values": "score_temp_budget_mib",
  "teacher": "score_temp_budget_mib",
  "reward_model": "score_temp_budget_mib",
  "judge": "rollout_temp_budget_mib",  # it samples as the rollout does
  "teachers": "rollout_temp_budget_mib",  # so do ampo's teachers
  "reward_model_train": "train_temp_budget_mib",  # a train step too
}


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Other models that sample in a run (an experiment's `samplers(cfg)`
  values, experiments/plan.py): the config they sample at (model, prompts,
  tokens, rows), and how many models of it the run loads, each resident
  and sampling in turn (ampo's teachers). A plain config is one model."""

  config: object
  models: int = 1


@dataclasses.dataclass
class Program:
  """A compiled program's per-device memory and cost."""

  name: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  flops: float  # per device, as XLA counts them (a loop body once)
  # Per device, each of the program's own loops (lax.scan, fori_loop;
  # nested ones too) times its trip count: XLA's count scaled by
  # hlo_loops.estimate's looped / flat bytes.
  bytes_accessed: float
  largest: list[tuple[int, str, str]]  # (bytes, shape, op) per device
  # Per device, bytes its collectives send to other devices, every loop
  # multiplied out (hlo_loops.Estimate.ici; a loop whose trip count is
  # not read counts `loop_trips` times), and of them those inside such
  # loops, per trip (a sampler's decode loop: ici.ici_times scales it).
  ici_bytes: float = 0.0
  ici_unread: float = 0.0
  # Of ici_bytes, one continuous-batching refill's (hlo_loops' `apart`
  # scope, continuous_loop.REFILL_SCOPE; not in ici_unread), and the
  # refills a call runs (plan/rollout.compile_rollout).
  ici_refill: float = 0.0
  refills: int = 0
  kernels: tuple[str, ...] = ()  # custom-call targets (Pallas: tpu_custom_call)
  loop_trips: tuple[int, ...] = ()  # each own loop's trip count (0: unread)
  resident_bytes: int = 0  # other live arrays beside it, per device
  # Temporaries the program keeps in its host's memory, per device (each
  # layer's saved input under --remat_policy=offload): not in peak_bytes.
  host_temp_bytes: int = 0
  # Per device, bytes a call copies between the device's memory and its
  # host's (those saved inputs out in the forward and back in the
  # backward), every loop multiplied out (hlo_loops.Estimate.host).
  host_copy_bytes: float = 0.0
  rows: int = 0  # sequences per call (rollout, ref_logp, critic_step)
  calls: int = 0  # calls per RL step, where counted (critic_step)
  # A rollout's rows as rollout_memory estimates them per device (what a
  # run sizes its calls by; 0: not estimated, a tree rollout's).
  estimate_bytes: int = 0
  # {flag: value} the run needs beyond its config, where the planner
  # found them (aot.compile_run): --rollout_rows (fewer rows per sampler
  # call than the loop would size), --rm_micro_batches.
  run_flags: dict = dataclasses.field(default_factory=dict)
  decoders: int = 1  # decoders the train step trains (2 with a critic)
  # Parameters of the model a scoring forward runs, where not the policy's
  # (a teacher's, a reward model's): its roofline FLOPs (summary.times).
  model_params: int = 0
  # Its TEMP_BUDGETS field's value (0: the compiler's default).
  temp_budget_mib: int = 0
  note: str = ""  # what the planner tried beyond the defaults, if it failed
  # (config, architecture, models) another model's sampler runs at
  # (rm_grpo's judge, ampo's teachers: plan/rollout.compile_sampler), for
  # its roofline time: `models` of that architecture sample one after
  # another (Sampler).
  sampled: tuple = ()
  # The compiled program itself (runs on real arrays of the same shapes
  # and shardings where the mesh is local: bench/measured_vs_planned.py).
  executable: object = dataclasses.field(default=None, repr=False)

  @property
  def rows_flag(self) -> int:
    """The --rollout_rows the run needs (0: as the loop sizes its calls)."""
    return self.run_flags.get("rollout_rows", 0)

  @property
  def peak_bytes(self) -> int:
    """Resident arrays + arguments + outputs not aliased to them +
    temporaries + code."""
    return (
      self.resident_bytes
      + self.argument_bytes
      + self.output_bytes
      - self.alias_bytes
      + self.temp_bytes
      + self.code_bytes
    )


_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')


def largest_buffers(text: str, k: int = 10):
  """The k largest arrays the optimized per-device HLO stores: (bytes,
  "dtype[dims]", the ops producing it), one per distinct shape; an array
  in host memory is named "dtype[dims] (host)". Values inside fused
  computations are left out: they live in a kernel's registers or VMEM,
  not in HBM (a [1, D] x [D, V] product rewritten to a fused multiply +
  reduce names an f32[D, V] there that is never stored)."""
  comps, _ = hlo_text.parse(text)
  fused = {
    c
    for insts in comps.values()
    for inst in insts
    if inst.op == "fusion"
    for c in hlo_text.attr(inst, "calls")
  }
  seen: dict[str, tuple[float, set]] = {}
  for comp, insts in comps.items():
    if comp in fused:
      continue
    for inst in insts:
      arrays = hlo_text.laid_out(inst.shape)
      if inst.shape.startswith("(") or len(arrays) != 1 or not arrays[0][0]:
        continue  # a tuple (its arrays are named where made), or a token
      size, host = arrays[0]
      shape = inst.shape.split("{")[0] + (" (host)" if host else "")
      seen.setdefault(shape, (size, set()))[1].add(inst.op)
  top = sorted(
    ((int(b), s, ",".join(sorted(ops)[:3])) for s, (b, ops) in seen.items()),
    reverse=True,
  )
  return top[:k]


def analyse(name: str, compiled, loop_trips: int = 1) -> Program:
  """The program's memory and cost. XLA counts each loop body's bytes once;
  they are scaled by the loops' trip counts read from the HLO
  (hlo_loops), or by `loop_trips` where a loop's count cannot be read."""
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, list):  # older JAX: one dict per device
    cost = cost[0] if cost else {}
  text = compiled.as_text()
  loops = hlo_loops.estimate(text, apart=continuous_loop.REFILL_SCOPE)
  factor = loop_trips if loops.unknown else max(loops.factor, 1.0)
  return Program(
    name=name,
    argument_bytes=int(mem.argument_size_in_bytes),
    output_bytes=int(mem.output_size_in_bytes),
    alias_bytes=int(mem.alias_size_in_bytes),
    temp_bytes=int(mem.temp_size_in_bytes),
    host_temp_bytes=int(getattr(mem, "host_temp_size_in_bytes", 0) or 0),
    host_copy_bytes=loops.host,
    code_bytes=int(mem.generated_code_size_in_bytes),
    flops=float(cost.get("flops", 0.0)),
    bytes_accessed=float(cost.get("bytes accessed", 0.0)) * factor,
    ici_bytes=loops.ici + loops.ici_unread * (loop_trips - 1),
    ici_unread=loops.ici_unread,
    ici_refill=loops.ici_apart,
    largest=largest_buffers(text),
    kernels=tuple(sorted(set(_CUSTOM_CALL.findall(text)))),
    loop_trips=tuple(0 if b in loops.unknown else n for b, n in loops.loops),
    executable=compiled,
  )


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def shortfall(error: str) -> int:
  """Bytes by which libtpu's memory overran its bound, from its refusal
  ("the total memory required for HLO temporaries (12.45G) exceeds
  available HBM (12.36G)", or "CompileTimeHbmOom: ... Used 13.75G of
  13.16G hbm"); 0 when the message says neither."""
  m = re.search(
    r"temporaries \(([\d.]+)([KMGT])\) exceeds available HBM "
    r"\(([\d.]+)([KMGT])\)|Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm",
    error,
  )
  if not m:
    return 0
  need, unit, have, of = (g for g in m.groups() if g is not None)
  return max(0, int(float(need) * _UNITS[unit] - float(have) * _UNITS[of]))


def host_peak_gb() -> float:
  """This process's peak resident memory so far, GB: libtpu's compiler
  takes 8-24 GB of the host for a 7B program."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (1e9 if sys.platform == "darwin" else 1e6)  # bytes / KB
