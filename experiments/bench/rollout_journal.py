r"""What a rollout's journal costs: rollout.generate with and without one.

  python -m experiments.bench.rollout_journal
  python -m experiments.bench.rollout_journal --progress_steps=32

bench.sampling's small shape (4 layers, d_model 256, vocab 8192; random
fp32 weights), --rows prompts of 32 tokens and T=128 new tokens through
--slots continuous-batching slots, sampled as the loop samples a rollout:
with `interrupt` (host calls every --progress_steps decode steps, the
loop's engine.PROGRESS_STEPS by default, where a stop may come), with and
without a journal (a fresh temporary directory each call: every finished
row is written). Prints seconds per rollout of both (best of --repeats,
interleaved; compile excluded by a warm-up call each), their ratio, the
rows and bytes the journal kept per rollout, and checks that both sampled
the same tokens.
"""

import os
import tempfile
import time

import jax
import numpy as np
from absl import app
from absl import flags

from experiments.bench import rollout_lengths
from experiments.bench.rollout_lengths import small_model
from experiments.bench import sampling as bench_sampling
from rlreason import devices
from rlreason.sampling import engine
from rlreason.sampling import rollout

_PROGRESS_STEPS = flags.DEFINE_integer(
  "progress_steps", 0, "Decode steps per host call (0: the loop's)."
)
# --rows and --slots come with bench.rollout_lengths, --repeats with
# bench.sampling (imported for the small model and its shape).


class _Ids:
  """The tokenizer rollout.generate needs: pad and EOS ids, no text."""

  pad_id, eos_id = 0, 1

  def decode(self, ids):
    return ""


def bench(rows: int, slots: int, repeats: int) -> dict:
  shape = bench_sampling.SHAPES["small"]
  model_cfg, params = small_model()
  rng = np.random.default_rng(0)
  prompts = rng.integers(2, model_cfg.vocab_size, (rows, shape.prompt_len))
  kept = {}

  def run(journaled: bool):
    with tempfile.TemporaryDirectory() as tmp:
      out = rollout.generate(
        params,
        prompts.tolist(),
        jax.random.key(0),
        0,
        model_cfg=model_cfg,
        tokenizer=_Ids(),
        max_new_tokens=shape.new_tokens,
        rows_per_call=slots,
        batching="continuous",
        interrupt=lambda: None,
        journal=tmp if journaled else None,
      )
      jax.block_until_ready(out.tokens)
      if journaled:
        files = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs]
        kept["files"] = len(files)
        kept["bytes"] = sum(os.path.getsize(f) for f in files)
        kept["rows"] = sum(len(np.load(f)["ids"]) for f in files)
    return out

  first = {j: run(j) for j in (False, True)}  # compiles
  np.testing.assert_array_equal(first[False].tokens, first[True].tokens)
  times = {False: [], True: []}
  for _ in range(repeats):
    for j in (False, True):
      start = time.perf_counter()
      run(j)
      times[j].append(time.perf_counter() - start)
  return {
    "plain_s": min(times[False]),
    "journal_s": min(times[True]),
    **kept,
  }


def main(argv):
  del argv
  if _PROGRESS_STEPS.value:
    engine.PROGRESS_STEPS = _PROGRESS_STEPS.value
  repeats = bench_sampling._REPEATS.value  # noqa: SLF001
  devices.no_tpu_probe_without_tpus()  # libtpu's probe on a CPU host
  print(f"device: {jax.devices()[0].device_kind}")
  rows = rollout_lengths._ROWS.value  # noqa: SLF001
  slots = rollout_lengths._SLOTS.value  # noqa: SLF001
  r = bench(rows, slots, repeats)
  print(
    f"{rows} rows, {slots} slots, host calls every "
    f"{engine.PROGRESS_STEPS} decode steps, best of {repeats}: "
    f"without a journal {r['plain_s']:.3f} s, with {r['journal_s']:.3f} s "
    f"= {r['journal_s'] / r['plain_s']:.3f}x; the journal kept "
    f"{r['rows']} rows in {r['files']} parts, {r['bytes'] / 2**20:.1f} MiB "
    "(same tokens)"
  )


if __name__ == "__main__":
  app.run(main)
