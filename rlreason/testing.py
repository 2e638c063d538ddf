"""Helpers shared by the tests (and usable from notebooks)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from rlreason import devices
from rlreason.model import transformer


def digits_reward(completions, answers=None) -> np.ndarray:
  """The digits each completion writes: a reward that varies within every
  group from the first step, so a few steps of a barely trained model have
  non-zero advantages and move the parameters (a correctness reward can be
  0 for every sample of such a model, and its updates then all zero)."""
  return np.array([sum(ch.isdigit() for ch in c) for c in completions], "f4")


def register_digits_reward() -> str:
  """Registers digits_reward as the reward "digits" (once per process);
  returns the name, for --reward."""
  from rlreason import rewards  # noqa: PLC0415 - tests only

  if "digits" not in rewards.names():
    rewards.register("digits", digits_reward)
  return "digits"


def tiny_model_config(**overrides) -> transformer.ModelConfig:
  """The tests' 2-layer, 32-wide decoder (GQA 4:2 heads); `overrides` set
  the vocabulary and family switches (qkv_bias, qk_norm, ...)."""
  return transformer.ModelConfig(
    **{
      "vocab_size": 128,
      "d_model": 32,
      "n_layers": 2,
      "n_heads": 4,
      "n_kv_heads": 2,
      "head_dim": 8,
      "mlp_dim": 64,
      **overrides,
    }
  )


def jaxpr_eqns(fn, *args) -> list:
  """Every equation of fn's jaxpr at `args`, those of nested jaxprs (jit,
  scan, custom rules) included."""
  import jax.extend  # noqa: PLC0415

  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      found.append(eqn)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def left_padded_prompts(lengths, vocab_size: int, pad_id: int = 0, seed=0):
  """Random prompts of the given lengths, left padded to the longest:
  tokens [N, P] (ids in [10, vocab_size)) and positions (-1 on padding),
  numpy int32."""
  rng = np.random.default_rng(seed)
  p = max(lengths)
  tokens = np.full((len(lengths), p), pad_id, np.int32)
  positions = np.full((len(lengths), p), -1, np.int32)
  for i, n in enumerate(lengths):
    tokens[i, p - n :] = rng.integers(10, vocab_size, n)
    positions[i, p - n :] = np.arange(n)
  return tokens, positions


def tiny_context(cfg, **fields):
  """A context.Context of `cfg` on one device with its randomly initialised
  model (a preset), for tests that call make_batch functions directly;
  `fields` set other Context fields (params defaults to the model's)."""
  from rlreason.train import context  # Deferred: a heavy import, tests only.
  from rlreason.train import loaders
  from rlreason import mesh as mesh_lib

  mesh = mesh_lib.make_mesh(1, 1, 1)
  model_cfg, params = loaders.load_model(cfg, mesh)
  return context.Context(
    cfg,
    model_cfg,
    loaders.load_tokenizer(cfg),
    mesh,
    *loaders.make_reward_fns(cfg),
    **{"params": params, **fields},
  )


def room_for(
  monkeypatch, model_cfg, prompt_len, new_tokens, sequences, tensor=1
):
  """Makes every device report free memory for `sequences` (a float)
  sequences of prompt_len + new_tokens (rollout_memory.sequence_bytes, on
  a mesh whose tensor axis has size `tensor`), so a sampler sizing its
  calls from free memory fits floor(sequences) per device."""
  from rlreason.sampling import rollout_memory

  seq = rollout_memory.sequence_bytes(model_cfg, prompt_len, new_tokens, tensor)
  free = int(sequences * seq / rollout_memory.ROLLOUT_FREE_FRACTION)
  monkeypatch.setattr(devices, "device_free_memory", lambda mesh: free)


def spy(monkeypatch, owner, name: str, record) -> list:
  """Wraps owner.name so each call first appends record(*args, **kwargs)
  to the list returned."""
  seen, real = [], getattr(owner, name)

  def wrapped(*args, **kwargs):
    seen.append(record(*args, **kwargs))
    return real(*args, **kwargs)

  monkeypatch.setattr(owner, name, wrapped)
  return seen


def hooked_combine(combine, hook):
  """A rewards.combine whose reward functions, after each call, pass
  (call index from 1, the [N] float32 rewards) to `hook` and return its
  rewards: a test's signal, or NaN, at a chosen step (one call a step)."""
  calls = []

  def hooked(weights):
    fn = combine(weights)

    def reward_fn(completions, answers, **kwargs):
      total, parts = fn(completions, answers, **kwargs)
      calls.append(1)
      return hook(len(calls), np.array(total, np.float32)), parts

    return reward_fn

  return hooked


def tiny_rollout(ctx, examples, step: int = 0, progress=None):
  """ctx.generate of `examples` as the loop samples a step: the policy's
  params, key `step`, cfg's group size and temperature (reporting to
  `progress`)."""
  from rlreason.sampling import draw  # Deferred, as in tiny_context.

  return ctx.generate(
    ctx.params,
    examples,
    jax.random.key(step),
    step,
    group_size=ctx.cfg.group_size,
    sampling=draw.Sampling(temperature=ctx.cfg.temperature),
    progress=progress,
  )


# Config overrides for a run of seconds on CPU that keeps each method's
# algorithmic choices: 2 steps, a 2-step warm start, 4 eval problems, a
# checkpoint every step. tests/experiments_test.py smoke-runs every
# experiment with them.
SMOKE = dict(
  steps=2,
  batch_size=4,
  group_size=4,
  max_new_tokens=16,
  warm_start_steps=2,
  warm_start_batch_size=8,
  eval_size=4,
  checkpoint_every=1,
  tensorboard=False,
  # One device: no cross-device collectives to starve on a loaded 2-core
  # machine; sharded == single-device is tested in train_step_test.py.
  mesh_fsdp=1,
)


def experiment_cmd(module: str, workdir, cache_dir, **overrides) -> list[str]:
  """The command line of `python -m experiments.<module>`: SMOKE settings
  updated with `overrides`, as --key=value arguments."""
  settings = {**SMOKE, **overrides}
  return [
    sys.executable,
    "-m",
    f"experiments.{module}",
    *[f"--{k}={v}" for k, v in settings.items()],
    f"--workdir={workdir}",
    f"--cache_dir={cache_dir}",
  ]


def xla_flags(devices: int | None = None, *extra: str) -> str:
  """XLA_FLAGS for a subprocess: this process's flags (tests/conftest.py's
  compile settings) with `devices` simulated CPU devices in place of its
  count (none: XLA's one), then `extra`."""
  count = "--xla_force_host_platform_device_count"
  flags = os.environ.get("XLA_FLAGS", "").split()
  flags = [f for f in flags if not f.startswith(count)]
  if devices is not None:
    flags.append(f"{count}={devices}")
  return " ".join([*flags, *extra])


def run_killed_and_resumed(
  cmd_a: list[str],
  cmd_b: list[str],
  workdir_b,
  *,
  kill_after: int = 2,
  env: dict[str, str | None] | None = None,
) -> tuple[list[int], str]:
  """Runs cmd_a to the end; runs cmd_b, SIGKILLs it once its checkpoint
  `kill_after` exists, then reruns cmd_b to the end (it must resume).
  `env` sets (or, with None, removes) variables of the three processes.
  Raises AssertionError with the process's stderr on any failure.

  Returns:
    The checkpoint steps cmd_b had saved when it was killed, and the
    rerun's stderr.
  """
  # One CPU device: drop the 8 simulated devices tests/conftest.py asks for.
  env = {
    **{k: v for k, v in os.environ.items() if not k.startswith("XLA_")},
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": xla_flags(),
    **(env or {}),
  }
  env = {k: v for k, v in env.items() if v is not None}
  subprocess.run(cmd_a, check=True, env=env, capture_output=True, timeout=600)
  # Its stderr to a file, not a pipe nobody reads while it runs: a full
  # pipe would stop a verbose run before its checkpoint.
  with tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(
      cmd_b, env=env, stdout=subprocess.DEVNULL, stderr=err
    )
    ready = os.path.join(workdir_b, "checkpoints", str(kill_after))
    deadline = time.time() + 600
    while not os.path.exists(ready):
      if proc.poll() is not None or time.time() > deadline:
        proc.kill()
        proc.wait()
        err.seek(0)
        raise AssertionError(
          f"no checkpoint {kill_after} (exit {proc.returncode}): "
          + err.read().decode()[-3000:]
        )
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  saved = sorted(
    int(d)
    for d in os.listdir(os.path.join(workdir_b, "checkpoints"))
    if d.isdigit()
  )
  resumed = subprocess.run(
    cmd_b, env=env, capture_output=True, text=True, timeout=600
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  return saved, resumed.stderr


def train_rows(workdir) -> dict[int, dict]:
  """step -> the step's last metrics.jsonl row, without wall-clock fields."""
  rows = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    r = json.loads(line)
    if "loss" in r:
      rows[r["step"]] = {
        k: v
        for k, v in r.items()
        if not k.startswith(("time", "tokens_per_sec"))
      }
  return rows


def checkpoints(workdir) -> dict[int, tuple[dict, object]]:
  """step -> (meta, params) of every checkpoint kept in workdir."""
  import orbax.checkpoint as ocp

  mgr = ocp.CheckpointManager(
    os.path.join(workdir, "checkpoints"), item_names=("state", "meta")
  )
  out = {}
  for step in mgr.all_steps():
    got = mgr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
      ),
    )
    state = got.state
    params = state[0] if isinstance(state, (list, tuple)) else state["params"]
    out[step] = (got.meta, params)
  mgr.close()
  return out
