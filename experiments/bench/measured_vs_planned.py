r"""Measured vs planned: the planner's own compiled programs, run for real.

  python -m experiments.bench.measured_vs_planned          # a GPU: 1.5B, bf16
  python -m experiments.bench.measured_vs_planned --model=tiny --rows=8 \
      --prompt_len=16 --new_tokens=32 --short_tokens=8    # CPU smoke run

grpo's Config at the flags' shapes (bf16 compute, fp32 parameters and
AdamW moments, KL to a bf16 reference, layers rematerialised) is planned
for the local devices exactly as `python -m experiments.plan
--topology=local` plans it (plan/aot.py: AOT compile, memory_analysis,
the roofline of plan/summary.py with the chip's peak from plan/chips.py).
Then the same compiled executables run on random-init parameters:

  train     one step of --rows sequences of --prompt_len + --new_tokens
            tokens in --micro_batches micro-batches (loss, gradient, AdamW
            update, state donated), the reference parameters resident as
            in a KL run. Reported: seconds per step (best of --repeats after
            a warm-up), MFU = model FLOPs (6 * params * tokens + causal
            attention, no remat) / (seconds * peak bf16 FLOP/s), and the
            device's peak bytes in use vs the plan's peak.
  rollout   the static sampler at --rollout_rows sequences (bf16
            parameters as rollout_layout.on_mesh lays them out, the train state
            resident), --temperature, --new_tokens steps; then the same
            sampler compiled for --short_tokens steps. Decode seconds per
            step = the difference / the steps between; the bound is the
            bytes one decode step must read (the parameters and the mean
            KV cache of those steps) / HBM bandwidth.

Each phase runs in its own process, so each peak is its own (JAX cannot
reset a device's peak counter). Peaks come from `memory_stats()`
(`peak_bytes_in_use`; a GPU's allocator), absent on CPU. `--out` writes
the numbers as JSON (after each phase: a later one may be cut off),
`--phase_timeout` bounds each phase, `--profile_top=N` traces one more call
of each program and prints its N longest kernels (the device's; the host's
XLA threads on CPU). Targets (issue 23): train MFU >= 40% of bf16 peak,
decode >= 50% of the HBM-bandwidth bound. Measured on an H100: README.md's
Benchmarks.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

import jax
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.model import attention
from rlreason.plan import aot
from rlreason.plan import program as program_lib
from rlreason.plan import chips
from rlreason.plan import state as state_lib
from rlreason.plan import summary
from rlreason.sampling import draw
from rlreason.sampling import rollout_memory
from rlreason.sampling import sampler
from rlreason.train import train_step as ts

# The phases' environment: importing experiments.plan sets libtpu's
# planning env (JAX_PLATFORMS=cpu, ...), which must not reach them. This
# process's JAX has read its platforms already (jax is imported above).
_ENV = dict(os.environ)

from experiments import plan as plan_cli  # noqa: E402
from experiments import plan_hooks  # noqa: E402
from experiments.bench import measure  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "qwen2.5-1.5b", "a preset of model/presets.py")
flags.DEFINE_integer("rows", 64, "sequences per train step")
flags.DEFINE_integer("micro_batches", 8, "micro-batches per train step")
flags.DEFINE_integer("prompt_len", 512, "prompt tokens")
flags.DEFINE_integer("new_tokens", 1024, "response tokens")
flags.DEFINE_integer("rollout_rows", 256, "sequences per sampler call")
flags.DEFINE_integer("short_tokens", 128, "the short sampler's steps")
flags.DEFINE_string("remat_policy", "dots", "full | dots | none (no remat)")
flags.DEFINE_float("temperature", 1.0, "the sampler's (0: greedy)")
flags.DEFINE_string(
  "decode_attention",
  "auto",
  "auto | dense | ragged (attention.resolve_decode: auto is ragged on a "
  "CUDA GPU of compute capability >= 8.0)",
)
flags.DEFINE_string("attention", "auto", "attention.IMPLEMENTATIONS")
flags.DEFINE_bool(
  "stack_gate_up",
  True,
  "the sampler's parameters hold each MLP's gate and up kernels stacked "
  "(ModelConfig.stack_gate_up; --nostack_gate_up: the two, as trained)",
)
flags.DEFINE_integer("repeats", 3, "timed calls per program")
flags.DEFINE_integer(
  "ceiling_n", 8192, "the measured ceilings' matmul size (bf16 n x n x n)"
)
flags.DEFINE_string("phase", "all", "all | train | rollout")
flags.DEFINE_integer(
  "profile_top",
  0,
  "after timing, trace one more call and print the N kernels that took "
  "the most device time (0: no trace)",
)
flags.DEFINE_string(
  "dump_hlo",
  "",
  "write each phase's compiled program here as optimized HLO text "
  "(<phase>.hlo.txt: the fusions --profile_top names)",
)
flags.DEFINE_string(
  "out", "", "write the results here (JSON; rewritten after each phase)"
)
flags.DEFINE_integer(
  "phase_timeout", 0, "seconds each phase's process may run (0: no limit)"
)

GIB = 1 << 30


def config():
  overrides = dict(
    model=FLAGS.model,
    dtype="bfloat16",
    param_dtype="float32",
    remat=FLAGS.remat_policy != "none",
    remat_policy="full" if FLAGS.remat_policy == "none" else FLAGS.remat_policy,
    temperature=FLAGS.temperature,
    decode_attention=FLAGS.decode_attention,
    batch_size=FLAGS.rows // 8,
    group_size=8,
    minibatches=1,
    micro_batches=FLAGS.micro_batches,
    max_prompt_len=FLAGS.prompt_len,
    max_new_tokens=FLAGS.new_tokens,
    steps=10,
    # One sampler call of --rollout_rows (not continuous batching's slots):
    # its decode steps are what the bound describes.
    rollout_batching="static",
  )
  cfg, loss_fn, _ = plan_hooks.experiment_config("grpo", "laptop", overrides)
  model_cfg = dataclasses.replace(
    aot.model_config(cfg),
    attention=FLAGS.attention,
    stack_gate_up=FLAGS.stack_gate_up,
  )
  return cfg, loss_fn, model_cfg


def print_kernel_times(fn) -> None:
  if FLAGS.profile_top <= 0:
    return
  progress(f"tracing one call: the {FLAGS.profile_top} longest kernels")
  for line, name, calls, secs in measure.kernel_times(fn, FLAGS.profile_top):
    print(f"  {secs * 1e3:10.2f} ms {calls:7d}x  [{line}] {name[:140]}")


def train_state(cfg, model_cfg, mesh):
  """A random TrainState laid out as the planner's (moments zero)."""
  state_abs, state_sh, optimizer = state_lib.train_state(cfg, model_cfg, mesh)
  params = measure.random_params(state_abs.params)
  init = jax.jit(
    functools.partial(ts.init_state, optimizer=optimizer),
    out_shardings=state_sh,
  )
  return init(params)


def train_batch(cfg, model_cfg, rows, mesh):
  shapes = state_lib.train_batch(cfg, rows)
  p, t = cfg.max_prompt_len, cfg.max_new_tokens
  rng = np.random.default_rng(0)
  batch = {
    "tokens": rng.integers(1, model_cfg.vocab_size, (rows, p + t)),
    "positions": np.broadcast_to(np.arange(p + t), (rows, p + t)),
    "mask": np.ones((rows, t)),
    "adv": rng.standard_normal(shapes["adv"].shape),
  }
  for name, s in shapes.items():  # log-probs of a near-uniform policy
    batch.setdefault(name, np.full(s.shape, -np.log(model_cfg.vocab_size)))
  sh = mesh_lib.batch_sharding(mesh, 1)
  return {
    k: jax.device_put(np.asarray(v, shapes[k].dtype), sh)
    for k, v in batch.items()
  }


def progress(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def plan(cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw, program, rows):
  progress(f"compiling {program}")
  t0 = time.perf_counter()
  progs = aot.compile_run(
    cfg,
    loss_fn,
    mesh,
    programs=(program,),
    rollout_rows=rows,
    hbm_bytes=hbm,
    model_cfg=model_cfg,
  )
  compile_s = time.perf_counter() - t0
  progress(f"compiled {program} in {compile_s:.0f} s")
  prog = progs[program]
  if not isinstance(prog, program_lib.Program):  # compile_run returns the error
    raise RuntimeError(f"{program} did not compile: {prog}")
  check_fits(prog, hbm)
  if FLAGS.dump_hlo:
    os.makedirs(FLAGS.dump_hlo, exist_ok=True)
    path = os.path.join(FLAGS.dump_hlo, f"{program}.hlo.txt")
    with open(path, "w") as f:
      f.write(prog.executable.as_text())
  seconds = summary.times(cfg, model_cfg, progs, n_dev, peak, bw)[program]
  return prog, seconds, compile_s


def check_fits(prog: program_lib.Program, hbm: int) -> None:
  """Raises before anything runs when the plan's peak is over the device's
  memory (an H100 ran 512 rollout rows out of memory: a 57.1 GiB
  allocation beside the resident train state)."""
  if prog.peak_bytes > hbm:
    raise RuntimeError(
      f"{prog.name}: the plan's peak {_gib(prog.peak_bytes)} is over the "
      f"device's {_gib(hbm)}; not run (fewer --rows or --rollout_rows, more "
      "--micro_batches)"
    )


def phase_train(cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw):
  prog, planned_s, compile_s = plan(
    cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw, "train_step", 0
  )
  state = train_state(cfg, model_cfg, mesh)
  ref = measure.random_params(  # resident, as in a KL run
    state_lib.ref_params(model_cfg, mesh), model_cfg.compute_dtype
  )
  batch = train_batch(cfg, model_cfg, cfg.num_sequences, mesh)
  box = {"state": state}

  def step():
    box["state"], metrics = prog.executable(box["state"], batch)
    return metrics

  progress("train state materialised; timing the step")
  seconds, metrics = measure.timed(step, FLAGS.repeats)
  progress(f"train step {seconds:.3f} s")
  print_kernel_times(step)
  context = cfg.max_prompt_len + cfg.max_new_tokens
  flops = summary.model_flops_per_token(model_cfg, context)
  flops *= cfg.num_sequences * context / n_dev
  del ref
  return {
    "compile_s": compile_s,
    "planned_peak_bytes": prog.peak_bytes,
    "planned_temp_bytes": prog.temp_bytes,
    "measured_peak_bytes": measure.peak_in_use(),
    "planned_s": planned_s,
    "measured_s": seconds,
    "model_flops": flops,
    "mfu": flops / (seconds * peak),
    "loss": float(metrics["loss"]),
  }


def phase_rollout(cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw):
  rows = FLAGS.rollout_rows
  prog, planned_s, compile_s = plan(
    cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw, "rollout", rows
  )
  state = train_state(cfg, model_cfg, mesh)  # resident beside the rollout
  params_abs = state_lib.rollout_params(model_cfg, mesh, hbm)
  params = measure.random_params(params_abs, model_cfg.compute_dtype)
  sh = mesh_lib.batch_sharding(mesh, 2, mesh_lib.ROLLOUT_RULES)
  p = cfg.max_prompt_len
  rng = np.random.default_rng(1)
  ids = jax.device_put(
    rng.integers(1, model_cfg.vocab_size, (rows, p)).astype(np.int32), sh
  )
  pos = jax.device_put(
    np.broadcast_to(np.arange(p, dtype=np.int32), (rows, p)), sh
  )
  key = jax.random.key(0)
  args = (params, ids, pos, key)
  progress("rollout inputs materialised; timing the sampler")
  seconds, out = measure.timed(lambda: prog.executable(*args), FLAGS.repeats)
  progress(f"sampler {seconds:.3f} s; compiling the short one")
  print_kernel_times(lambda: prog.executable(*args))
  generated = int(np.asarray(out.lengths).sum())
  measured_peak = measure.peak_in_use()
  # The same sampler for fewer steps: decode seconds per step by difference.
  short = FLAGS.short_tokens
  t0 = time.perf_counter()
  decoding = dataclasses.replace(  # as the planned rollout's
    model_cfg,
    decode_attention=attention.resolve_decode(cfg.decode_attention, mesh),
  )
  short_exe = sampler._sample.lower(  # noqa: SLF001 - the jitted body
    params, ids, pos, key,
    model_cfg=decoding, max_new_tokens=short,
    sampling=draw.Sampling(temperature=cfg.temperature),
    stop_ids=(0,), pad_id=0, return_logits=False, mesh=mesh,
  ).compile()  # fmt: skip
  compile_s += time.perf_counter() - t0
  short_s, _ = measure.timed(lambda: short_exe(*args), FLAGS.repeats)
  t = cfg.max_new_tokens
  decode_step_s = (seconds - short_s) / (t - short)
  # Bytes a decode step reads: its parameters, and the KV cache at the
  # mean length of the steps between `short` and t.
  weights = state_lib.per_device_bytes(params_abs)
  mean_length = p + (short + t) / 2
  cache = rollout_memory.cache_bytes(model_cfg, mean_length) * rows / n_dev
  bound_step_s = (weights + cache) / bw
  del state
  return {
    "compile_s": compile_s,
    "decode_attention": decoding.decode_attention,
    "stack_gate_up": decoding.stack_gate_up,
    "rows": rows,
    "generated_tokens": generated,
    "planned_peak_bytes": prog.peak_bytes,
    "planned_temp_bytes": prog.temp_bytes,
    "measured_peak_bytes": measured_peak,
    "planned_s": planned_s,
    "measured_s": seconds,
    "short_s": short_s,
    "decode_step_s": decode_step_s,
    "bound_step_s": bound_step_s,
    "decode_fraction_of_bound": bound_step_s / decode_step_s
    if decode_step_s > 0
    else None,
    "decode_tokens_per_s": rows / decode_step_s if decode_step_s > 0 else None,
  }


PHASES = {"train": phase_train, "rollout": phase_rollout}


def run_phase(name: str) -> dict:
  cfg, loss_fn, model_cfg = config()
  mesh, hbm, n_dev, peak, bw, _ = plan_cli.mesh_for("local", cfg)
  dev = jax.devices()[0]
  head = {
    "phase": name,
    "device": dev.device_kind,
    "devices": n_dev,
    "jax": jax.__version__,
    "hbm_bytes": hbm,
    "peak_flops": peak,
    "hbm_bandwidth": bw,
    "model": FLAGS.model,
    "params": model_cfg.num_params(),
    "attention": model_cfg.attention,
    # False: no published peak for this device (CPU); MFU and the decode
    # bound use plan.mesh_for's placeholders.
    "peaks_known": chips.local_peaks(dev) is not None,
  }
  try:
    result = PHASES[name](cfg, loss_fn, model_cfg, mesh, hbm, n_dev, peak, bw)
    # After the phase, so that its peak is its own.
    head.update(measure.measured_ceilings(FLAGS.ceiling_n))
    return {**head, **result}
  except Exception as e:  # noqa: BLE001 - reported, the next phase runs
    return {**head, "error": f"{type(e).__name__}: {str(e)[:2000]}"}


def _gib(x):
  return "-" if x is None else f"{x / GIB:.2f} GiB"


def report(results: list[dict]) -> str:
  lines = []
  for r in results:
    lines.append(
      f"{r['phase']}: {r['model']} ({r['params'] / 1e9:.2f}B params), "
      f"{r['device']} x{r['devices']}, jax {r['jax']}, "
      f"attention={r['attention']}"
      + ("" if r.get("peaks_known") else " (no published peak: placeholders)")
    )
    if "error" in r:
      lines.append(f"  error: {r['error']}")
      continue
    lines.append(
      f"  peak per device: planned {_gib(r['planned_peak_bytes'])} "
      f"(temporaries {_gib(r['planned_temp_bytes'])}), measured "
      f"{_gib(r['measured_peak_bytes'])}"
    )
    lines.append(
      f"  ceilings measured: bf16 matmul "
      f"{r['measured_matmul_flops'] / 1e12:.0f} TFLOP/s, copy "
      f"{r['measured_copy_bandwidth'] / 1e9:.0f} GB/s (plan: "
      f"{r['peak_flops'] / 1e12:.0f} TFLOP/s, "
      f"{r['hbm_bandwidth'] / 1e9:.0f} GB/s)"
    )
    lines.append(
      f"  seconds: planned (roofline) {r['planned_s']:.3f}, measured "
      f"{r['measured_s']:.3f} (ratio {r['measured_s'] / r['planned_s']:.2f}); "
      f"compile {r['compile_s']:.0f} s"
    )
    if r["phase"] == "train":
      lines.append(
        f"  train MFU {100 * r['mfu']:.1f}% of bf16 peak (target >= 40%); "
        f"{100 * r['mfu'] * r['peak_flops'] / r['measured_matmul_flops']:.1f}%"
        " of the measured matmul rate"
      )
    else:
      lines.append(
        f"  decode ({r.get('decode_attention', '?')} attention, gate/up "
        f"{'stacked' if r.get('stack_gate_up') else 'two kernels'}) "
        f"{1e3 * r['decode_step_s']:.2f} ms/step vs bound "
        f"{1e3 * r['bound_step_s']:.2f} ms: "
        f"{100 * (r['decode_fraction_of_bound'] or 0):.1f}% of the "
        f"HBM-bandwidth bound (target >= 50%); {r['generated_tokens']} "
        "tokens generated"
      )
  return "\n".join(lines)


def run_subprocess(name: str, extra=()) -> dict:
  args = [a for a in sys.argv[1:] if not a.startswith("--phase")]
  cmd = [sys.executable, "-m", "experiments.bench.measured_vs_planned"]
  try:
    proc = subprocess.run(
      cmd + args + list(extra) + [f"--phase={name}"],
      stdout=subprocess.PIPE,  # stderr (progress) passes through
      text=True,
      env=_ENV,
      timeout=FLAGS.phase_timeout or None,
    )
    stdout, status = proc.stdout, f"exit status {proc.returncode}"
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout
    stdout, status = stdout or "", f"timed out after {FLAGS.phase_timeout} s"
  lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
  if lines:
    result = json.loads(lines[-1][len("RESULT ") :])
  else:
    result = {"phase": name, "error": status}
  print(json.dumps(result)[:3000], flush=True)
  return result


def main(argv):
  del argv
  if FLAGS.phase != "all":
    result = run_phase(FLAGS.phase)
    print("RESULT " + json.dumps(result), flush=True)
    return
  results = []

  def keep(result):  # written as each phase ends: a later one may not
    results.append(result)
    if FLAGS.out:
      with open(FLAGS.out, "w") as f:
        json.dump(results, f, indent=1)

  keep(run_subprocess("train"))
  error = results[0].get("error", "")
  if error and not error.startswith("timed out") and FLAGS.attention == "auto":
    # cuDNN's flash attention may be missing: the plain-JAX blockwise one.
    keep(run_subprocess("train", ["--attention=blockwise"]))
  keep(run_subprocess("rollout"))
  print(report([r for r in results if "model" in r]))


if __name__ == "__main__":
  app.run(main)
