"""A plan's verdict: fit with margin, roofline step time, MFU, what to turn.

  s = summary.summarize(programs, cfg, model_cfg, hbm_bytes=..., chips=...,
                        peak_flops=..., hbm_bandwidth=...)
  print(summary.text(s))

Roofline: a program takes max(flops / peak, bytes / bandwidth) per device.
A train step's model FLOPs are 6 * params * tokens (forward + backward),
plus attention's 12 * layers * heads * head_dim * tokens * context / 2
(causal); MFU is model FLOPs per device over (step time * peak), with the
training time alone (the minibatches' train steps); the RL step time adds
one rollout call and one reference forward.
"""

import dataclasses

from rlreason.plan import aot

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
  programs: dict[str, aot.Program]
  advice: list[str]


def model_flops_per_token(model_cfg, context: int) -> float:
  """Forward + backward FLOPs per trained token (PaLM's appendix B)."""
  attn = 12 * model_cfg.n_layers * model_cfg.n_heads * model_cfg.head_dim
  return 6 * model_cfg.num_params() + attn * context / 2


def roofline_seconds(p: aot.Program, peak_flops, bandwidth) -> float:
  return max(p.flops / peak_flops, p.bytes_accessed / bandwidth)


def summarize(
  programs, cfg, model_cfg, *, hbm_bytes, devices, peak_flops, hbm_bandwidth
) -> Summary:
  ok = {k: p for k, p in programs.items() if isinstance(p, aot.Program)}
  errors = {
    k: str(e).splitlines()[0][:300]
    for k, e in programs.items()
    if not isinstance(e, aot.Program)
  }
  peak = max((p.peak_bytes for p in ok.values()), default=0)
  fits = not errors and peak <= (1 - FIT_MARGIN) * hbm_bytes
  times = {}
  for name, p in ok.items():
    calls = cfg.ppo_epochs * cfg.minibatches if name == "train_step" else 1
    times[name] = calls * roofline_seconds(p, peak_flops, hbm_bandwidth)
  step = sum(times.values())
  context = cfg.max_prompt_len + cfg.max_new_tokens
  tokens = cfg.num_sequences * context * cfg.ppo_epochs
  useful = model_flops_per_token(model_cfg, context) * tokens / devices
  train = times.get("train_step", 0.0)
  mfu = useful / (train * peak_flops) if train else 0.0
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
    advice=advice(ok, errors, cfg, hbm_bytes),
  )


def advice(programs, errors, cfg, hbm_bytes) -> list[str]:
  """Which knob to turn, for the program that needs the most memory."""
  out = []
  budget = (1 - FIT_MARGIN) * hbm_bytes
  for name, err in errors.items():
    out.append(f"{name} did not compile: {err}")
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
      out.append(
        f"train_step: {p.temp_bytes / GIB:.1f} GiB of temporaries: raise "
        f"--micro_batches (now {cfg.micro_batches}), keep --remat on"
      )
    elif name == "rollout":
      out.append(
        "rollout: fewer sequences per sampler call (--rollout_rows), or "
        "parameters sharded over fsdp in the rollout"
      )
    else:
      out.append(f"{name}: score the rollout in micro-batches (--score_rows)")
  return out


def text(s: Summary, title: str = "") -> str:
  lines = [title] if title else []
  verdict = "fits" if s.fits else "does NOT fit"
  lines.append(
    f"{verdict}: peak {s.peak_bytes / GIB:.2f} GiB of {s.hbm_bytes / GIB:.0f}"
    f" GiB per chip ({100 * s.margin:.0f}% free; needs "
    f">= {100 * FIT_MARGIN:.0f}%)"
  )
  for name, p in s.programs.items():
    lines.append(
      f"  {name:10s} peak {p.peak_bytes / GIB:7.2f} GiB = args "
      f"{p.argument_bytes / GIB:.2f} + out {p.output_bytes / GIB:.2f} - "
      f"alias {p.alias_bytes / GIB:.2f} + temp {p.temp_bytes / GIB:.2f}; "
      f"{p.flops / 1e12:.1f} TFLOP, {p.bytes_accessed / 1e9:.1f} GB"
    )
    for size, shape, op in p.largest[:10]:
      lines.append(f"      {size / GIB:8.3f} GiB  {shape}  {op}")
  lines.append(
    f"roofline RL step {s.step_seconds:.1f} s (train {s.train_seconds:.1f}"
    f" s), train MFU {100 * s.mfu:.0f}%"
  )
  lines += [f"advice: {a}" for a in s.advice]
  return "\n".join(lines)
