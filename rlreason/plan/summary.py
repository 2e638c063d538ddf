"""A plan's verdict: fit with margin, roofline step time, MFU, what to turn.

  s = summary.summarize(programs, cfg, model_cfg, hbm_bytes=..., devices=...,
                        peak_flops=..., hbm_bandwidth=..., ici_bandwidth=...)
  print(report.text(s))  # plan/report.py

Memory comes from the compiled programs. Time is an analytic roofline per
device, because XLA's cost_analysis counts a loop body once (and nested
loops, such as blockwise attention inside the micro-batch scan, not at
all):
  train step  max(FLOPs / peak, compiled bytes / bandwidth), the bytes
              XLA's with each of its own loops times its trip count
              (plan/hlo_loops.py), FLOPs = 6 *
              params * tokens + causal attention (PaLM, appendix B), times
              4/3 with remat (the forward runs twice);
  rollout     prefill FLOPs / peak + T decode steps, each reading the
              per-device parameters and the mean KV cache once (memory
              bound); a tree rollout's (1 + L) rounds of T steps per call,
              each reading its rows' whole caches (dense decode);
  ref_logp    2 * params * tokens / peak (forward only);
  values      the same, for a critic's forward (its trunk is the
              policy's); a critic also doubles the train step's FLOPs,
              unless it takes updates of its own:
  critic_step those updates (ppo --critic_minibatches), as the train
              step, over the rows they take (Program.rows x calls);
  teacher,    the same with the frozen model's parameters
  reward_model  (Program.model_params).
Where the slice's ICI bandwidth is given, each program's time is at least
the bytes its collectives send per device (Program.ici_bytes, every loop
multiplied out: the train step's FSDP weight gathers and gradient
reductions per micro-batch, an FSDP rollout's gathers per decode step)
over half the chip's bidirectional ICI bandwidth (it sends over all its
links at once, overlapped with compute: a bound, as the rest), times the
program's calls per RL step (plan/ici.py).
Stages a run goes through once, before its RL steps, are timed apart
(before_rl): rm_grpo's reward-model training, --rm_steps Bradley-Terry
steps, each max(6 * RM params * tokens (4/3 with remat) / peak, compiled
bytes / bandwidth).
The train step's copies between the chip and its host's memory (each
layer's saved input under --remat_policy=offload, out and back) are not
in its time: the report gives their bytes per RL step and the host
bandwidth per chip that would hide them behind the train steps' roofline.
MFU = the train steps' model FLOPs (without remat) / (their time * peak):
an upper bound, as a roofline is.
"""

import dataclasses

from rlreason import devices
from rlreason.model import transformer
from rlreason.plan import ici as ici_lib
from rlreason.plan import program as program_lib
from rlreason.sampling import tree_loop
from rlreason.train import train_step as ts

GIB = 1 << 30
FIT_MARGIN = 0.15  # a plan fits when its peak leaves this much HBM free


@dataclasses.dataclass
class Summary:
  peak_bytes: int  # the largest program's peak per device
  hbm_bytes: int
  fits: bool
  margin: float  # free fraction of HBM at the peak (negative: over)
  step_seconds: float  # roofline time of one RL step
  train_seconds: float  # of which the train steps
  mfu: float  # of the train steps
  errors: dict[str, str]
  programs: dict[str, program_lib.Program]
  advice: list[str]
  unsplit: str = ""  # train_step.unsplit: "" when the micro-batch splits
  before_seconds: float = 0.0  # once, before the RL steps (before_rl)
  # {program: seconds its collectives take per RL step} (ici.ici_times; the
  # programs' times above are at least these)
  ici_seconds: dict = dataclasses.field(default_factory=dict)
  # Per device and RL step, bytes the train steps copy between the chip
  # and its host's memory (--remat_policy=offload), not in the roofline.
  host_copy_bytes: float = 0.0


def model_flops_per_token(model_cfg, context: int) -> float:
  """Forward + backward FLOPs per trained token (PaLM's appendix B)."""
  return transformer.flops_per_token(model_cfg, context)


def _sampling_seconds(
  cfg, model_cfg, prog, devices, peak, bandwidth, decode_tokens=0
) -> float:
  """A sampler's roofline seconds per device for cfg's N rows of P + T:
  the prefill's FLOPs, then each decode step re-reading the weights (per
  call, as laid out) and the caches."""
  n, p, t = cfg.num_sequences, cfg.max_prompt_len, cfg.max_new_tokens
  params = model_cfg.num_params()
  dtype_bytes = 2 if model_cfg.dtype == "bfloat16" else 4
  kv = 2 * model_cfg.n_layers * model_cfg.n_kv_heads * model_cfg.head_dim
  calls, steps = ici_lib.sampler_calls(cfg, prog.rows, decode_tokens)
  weights = prog.argument_bytes  # per device, as laid out
  tree = tree_loop.call_shape(cfg)
  if not tree:
    # Each call's decode steps re-read the weights; the caches add up to N.
    prefill = 2 * params * n * (p + t - steps) / devices / peak
    cache = kv * dtype_bytes * n * (p + t / 2) / devices
    return prefill + steps * (calls * weights + cache) / bandwidth
  # Trees: each call's rounds decode in sequence, T steps each; every
  # leaf decodes in one round, reading all P + (1 + L) T slots of its
  # cache each step (dense); only the roots' prompts are prefilled.
  per_prompt, slots, _ = tree
  roots = per_prompt - cfg.group_size  # per prompt
  prefill = 2 * params * (n // cfg.group_size) * roots * p / devices / peak
  cache = kv * dtype_bytes * n * slots / devices
  return prefill + (steps * calls * weights + t * cache) / bandwidth


def times(
  cfg,
  model_cfg,
  programs,
  devices,
  peak,
  bandwidth,
  decode_tokens=0,
  score_forwards=0,
  ici_bandwidth=0.0,
) -> dict:
  """Roofline seconds per device of each program's share of one RL step.

  decode_tokens: how many of a row's T completion tokens the rollout
  decodes (0: all), the rest prefilled (multi-turn episodes: their
  actions decoded, their observations written into the cache).
  score_forwards: whole-batch forwards beyond the reference's, at the
  ref_logp program's shape (IGPO's answer probabilities, one per turn),
  timed as "scores".
  ici_bandwidth: each program takes at least its ici.ici_times."""
  n, p, t = cfg.num_sequences, cfg.max_prompt_len, cfg.max_new_tokens
  context = p + t
  params = model_cfg.num_params()
  out = {}
  if "train_step" in programs:
    prog = programs["train_step"]
    recompute = 4 / 3 if model_cfg.remat else 1.0
    flops = model_flops_per_token(model_cfg, context) * n * context
    flops *= prog.decoders  # the policy, and a critic's trunk
    flops *= cfg.ppo_epochs * recompute / devices
    memory = prog.bytes_accessed * cfg.ppo_epochs * cfg.minibatches
    out["train_step"] = max(flops / peak, memory / bandwidth)
  if "critic_step" in programs:  # a critic's own updates: rows x calls
    prog = programs["critic_step"]
    recompute = 4 / 3 if model_cfg.remat else 1.0
    flops = model_flops_per_token(model_cfg, context) * context
    flops *= prog.rows * prog.calls * recompute / devices
    memory = prog.bytes_accessed * prog.calls
    out["critic_step"] = max(flops / peak, memory / bandwidth)
  if "rollout" in programs:
    out["rollout"] = _sampling_seconds(
      cfg, model_cfg, programs["rollout"], devices, peak, bandwidth,
      decode_tokens,
    )  # fmt: skip
  for name, prog in programs.items():  # other models' samplers (a judge)
    if prog.sampled:
      sampler_cfg, sampler_model, models = prog.sampled
      out[name] = models * _sampling_seconds(
        sampler_cfg, sampler_model, prog, devices, peak, bandwidth
      )
  forward = 2 * params * n * context / devices / peak
  for name in ("ref_logp", "values", "teacher", "reward_model"):
    if name in programs:
      out[name] = forward * (programs[name].model_params or params) / params
  if score_forwards and "ref_logp" in programs:
    out["scores"] = score_forwards * forward
  ici = ici_lib.ici_times(
    cfg, programs, ici_bandwidth, score_forwards, decode_tokens
  )
  return {k: max(v, ici.get(k, 0.0)) for k, v in out.items()}


def before_rl(
  cfg, model_cfg, programs, devices, peak, bandwidth, ici_bandwidth=0.0
) -> float:
  """Roofline seconds per device of what runs once before the RL steps:
  rm_grpo's --rm_steps Bradley-Terry steps (reward_model_train, 2 x pairs
  rows of P + T tokens each, forward and backward)."""
  prog = programs.get("reward_model_train")
  if prog is None:
    return 0.0
  recompute = 4 / 3 if model_cfg.remat else 1.0
  tokens = prog.rows * (cfg.max_prompt_len + cfg.max_new_tokens)
  flops = 6 * prog.model_params * tokens * recompute / devices
  step = max(flops / peak, prog.bytes_accessed / bandwidth)
  if ici_bandwidth:
    step = max(step, prog.ici_bytes / (ici_bandwidth / 2))
  return getattr(cfg, "rm_steps", 0) * step


def summarize(
  programs,
  cfg,
  model_cfg,
  *,
  hbm_bytes,
  devices,
  peak_flops,
  hbm_bandwidth,
  decode_tokens=0,
  score_forwards=0,
  ici_bandwidth=0.0,
) -> Summary:
  ok = {k: p for k, p in programs.items() if isinstance(p, program_lib.Program)}
  errors = {
    k: str(e).splitlines()[0][:300]
    for k, e in programs.items()
    if not isinstance(e, program_lib.Program)
  }
  peak = max((p.peak_bytes for p in ok.values()), default=0)
  fits = not errors and peak <= (1 - FIT_MARGIN) * hbm_bytes
  per = times(
    cfg,
    model_cfg,
    ok,
    devices,
    peak_flops,
    hbm_bandwidth,
    decode_tokens,
    score_forwards,
    ici_bandwidth,
  )
  step = sum(per.values())
  context = cfg.max_prompt_len + cfg.max_new_tokens
  per_row = model_flops_per_token(model_cfg, context) * context / devices
  useful = per_row * cfg.num_sequences * cfg.ppo_epochs
  useful *= ok["train_step"].decoders if "train_step" in ok else 1
  if critic := ok.get("critic_step"):  # its updates: the rows they take
    useful += per_row * critic.rows * critic.calls
  train = per.get("train_step", 0.0) + per.get("critic_step", 0.0)
  mfu = useful / (train * peak_flops) if train else 0.0
  shards = ts.batch_shards(cfg, devices)  # 0 devices: none, nothing split
  host_copies = (
    ok["train_step"].host_copy_bytes * cfg.ppo_epochs * cfg.minibatches
    if "train_step" in ok
    else 0.0
  )
  if critic:
    host_copies += critic.host_copy_bytes * critic.calls
  ici = ici_lib.ici_times(cfg, ok, ici_bandwidth, score_forwards, decode_tokens)
  return Summary(
    peak_bytes=peak,
    hbm_bytes=hbm_bytes,
    fits=fits,
    margin=1 - peak / hbm_bytes if peak else float("nan"),
    step_seconds=step,
    train_seconds=train,
    mfu=mfu,
    errors=errors,
    programs=ok,
    advice=advice(
      ok, errors, cfg, hbm_bytes, shards, ici, step, model_cfg.n_kv_heads
    ),
    unsplit=ts.unsplit(cfg, shards),
    before_seconds=before_rl(
      cfg, model_cfg, ok, devices, peak_flops, hbm_bandwidth, ici_bandwidth
    ),
    ici_seconds=ici,
    host_copy_bytes=host_copies,
  )


def misses_by_memory(row) -> bool:
  """Whether a planned row (experiments/plan.py's) that does not fit failed
  only for memory (or compiled over the fit: no errors), so a larger
  slice may fit."""
  return all(map(devices.out_of_memory, row.get("errors", {}).values()))


def advice(
  programs,
  errors,
  cfg,
  hbm_bytes,
  shards=0,
  ici_seconds=None,
  step=0.0,
  kv_heads=0,
) -> list[str]:
  """Which knob to turn, for the program that needs the most memory
  (`shards`: the train batch's shards, train_step.batch_shards), and for
  a rollout whose collectives (`ici_seconds`, ici.ici_times) take most of
  the RL `step` (`kv_heads`: the model's, 0 = unknown: a tensor split
  that spans them is not told to grow, in the rollout nor the train
  step)."""
  out = []
  rollout_ici = (ici_seconds or {}).get("rollout", 0.0)
  if step and rollout_ici > step / 2:
    tensor = getattr(cfg, "rollout_tensor", 0) or getattr(cfg, "mesh_tensor", 1)
    if kv_heads and tensor >= kv_heads:  # no larger split divides them
      remedy = (
        f"the sampler's tensor split ({tensor}) already spans the model's "
        f"{kv_heads} KV heads: --rollout_layout=replicated keeps each "
        "chip's share where it fits beside the cache (fewer rows per "
        "call), else a chip with more memory"
      )
    else:
      remedy = (
        "a tensor split of its own (--rollout_tensor=N, N dividing the KV "
        "heads) keeps each chip's Nth of them"
      )
    out.append(
      f"rollout: its collectives take {rollout_ici:.0f} s of the "
      f"{step:.0f} s RL step (weights split over fsdp are gathered every "
      f"decode step): {remedy}"
    )
  budget = (1 - FIT_MARGIN) * hbm_bytes
  for name, err in errors.items():
    out.append(f"{name} did not compile: {err}")
  why = ts.unsplit(cfg, shards) if "train_step" in programs else ""
  if why:
    out.append(
      f"train_step: {why} (activations kept whole on groups of chips): "
      f"--micro_batches={ts.splitting_micro_batches(cfg, shards)}, or "
      "--mesh_tensor > 1"
    )
  for name, p in programs.items():
    if p.peak_bytes <= budget:
      continue
    if p.argument_bytes > budget / 2:
      out.append(
        f"{name}: parameters and optimizer state alone take "
        f"{p.argument_bytes / GIB:.1f} GiB per chip: a larger slice, or "
        "more --mesh_fsdp"
      )
    if name == "train_step":
      rows = ts.micro_batch_rows(cfg)
      if shards and rows <= shards:  # more micro-batches would not split
        tensor = max(getattr(cfg, "mesh_tensor", 1), 1)
        split = (
          "; --sequence_parallel splits each layer's saved input over it"
          if tensor > 1 and not getattr(cfg, "sequence_parallel", False)
          else ""
        )
        head = (
          f"train_step: {p.temp_bytes / GIB:.1f} GiB of temporaries at one "
          f"row per batch shard ({rows} rows per micro-batch, {shards} "
          "shards): "
        )
        offload = (
          "--remat_policy=offload (each layer's saved input in the host's "
          "memory), "
          if getattr(cfg, "remat", False)
          and getattr(cfg, "remat_policy", "") != "offload"
          else ""
        )
        if kv_heads and tensor >= kv_heads and not split:
          tail = (
            f"the tensor split ({tensor}) already spans the model's "
            f"{kv_heads} KV heads: {offload}a larger slice, or a chip with "
            "more memory"
          )
        else:
          tail = (
            "split each row's activations over more chips (--mesh_tensor, "
            f"now {tensor}{split}), {offload}or a larger slice"
          )
        out.append(head + tail)
        continue
      out.append(
        f"train_step: {p.temp_bytes / GIB:.1f} GiB of temporaries: raise "
        f"--micro_batches (now {cfg.micro_batches}), keep --remat on"
      )
    elif name == "rollout" or p.sampled:
      out.append(
        f"{name}: fewer sequences per sampler call (--rollout_rows), or "
        "parameters sharded over fsdp in the rollout (--rollout_layout=fsdp)"
      )
    elif name == "reward_model_train":
      out.append(
        f"{name}: {p.temp_bytes / GIB:.1f} GiB of temporaries: raise "
        "--rm_micro_batches (now "
        f"{getattr(cfg, 'rm_micro_batches', 1)}), or fewer pairs per "
        "Bradley-Terry step (--rm_batch_size)"
      )
    else:
      out.append(
        f"{name}: {p.temp_bytes / GIB:.1f} GiB of temporaries: fewer rows "
        f"per forward (--score_rows, now {p.rows}), or bound them "
        "(--score_temp_budget_mib)"
      )
  return out
