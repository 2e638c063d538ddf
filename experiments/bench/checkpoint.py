r"""How long a checkpoint stops training: blocking saves vs background ones.

The loop saves its TrainState (parameters + AdamW moments, float32) every
--checkpoint_every steps. A blocking save (what `--async_checkpoint=false`
does, and peers' default) holds the loop until the files are written; a
background save (the default) holds it until the state is copied to host
memory, and orbax writes while the next steps run. This script saves the
train state of the train-step benchmark's "medium" model (124.7M
parameters, ~1.5 GB with its moments) `--saves` times, each followed by a
donated update of the whole state and `--step_seconds` of waiting (a
device's step, during which the host is idle), both ways in the same run,
and prints the seconds the caller was held per save and the wall time.

  python -m experiments.bench.checkpoint                # local disk, ~1 min
  python -m experiments.bench.checkpoint --dir=gs://bucket/tmp  # a bucket
"""

import argparse
import tempfile
import time

import jax
import numpy as np

from experiments.bench import train_step as bench_step
from rlreason import devices
from rlreason.model import transformer
from rlreason.train import checkpoint
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts


def run(directory: str, background: bool, state, saves: int, wait_s: float):
  """(seconds held per save, wall seconds of all saves and steps)."""
  ckpt = checkpoint.Checkpointer(directory, keep=2, background=background)
  update = jax.jit(
    lambda s: jax.tree.map(lambda x: x * 0.5 + 1, s), donate_argnums=0
  )
  held = []
  t0 = time.perf_counter()
  for step in range(saves):
    t = time.perf_counter()
    ckpt.save(step, state, {"step": step})
    held.append(time.perf_counter() - t)
    state = jax.block_until_ready(update(state))  # donates what was saved
    time.sleep(wait_s)
  ckpt.close()  # the last write
  return held, time.perf_counter() - t0, state


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--dir", default="")
  parser.add_argument("--saves", type=int, default=4)
  parser.add_argument("--step_seconds", type=float, default=2.0)
  args = parser.parse_args()
  cfg = bench_step.MEDIUM
  params = transformer.init(cfg, jax.random.key(0))
  state = ts.init_state(
    params, optimizer_lib.make_optimizer(1e-5, total_steps=100)
  )
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  print(
    f"state: {cfg.num_params() / 1e6:.1f}M parameters + AdamW = "
    f"{size / 1e9:.2f} GB; {args.saves} saves, each followed by one "
    f"update and {args.step_seconds:g} s of device time"
  )
  results = {}
  for background in (False, True):
    name = "background" if background else "blocking"
    with tempfile.TemporaryDirectory() as tmp:
      where = f"{args.dir.rstrip('/')}/{name}" if args.dir else tmp
      held, wall, state = run(
        where, background, state, args.saves, args.step_seconds
      )
    results[name] = held, wall
    print(
      f"{name:>10}: held {np.median(held):.3f} s per save (median; "
      f"max {max(held):.3f}), wall {wall:.2f} s"
    )
  (held_b, wall_b), (held_a, wall_a) = results.values()
  ratio = np.median(held_a) / np.median(held_b)
  print(
    f"background / blocking: held {ratio:.2f}x, wall {wall_a / wall_b:.2f}x"
  )


if __name__ == "__main__":
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  main()
