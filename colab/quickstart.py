# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %% [markdown]
# # rlreason quickstart
#
# Train the shipped laptop base with GRPO on a procedural +/- task, plot its
# curves, sample from the trained policy, then swap in another paper's method
# with one line. Runs on the free CPU runtime in about 15 minutes; on a TPU
# runtime, point `REAL_MODEL` (the parameter cell) at a Hugging Face
# checkpoint directory.
#
# This notebook only imports the library: everything it does is
# `python -m experiments.grpo` with flags.

# %%
# Install a pinned version (Colab). From a local checkout use
# `pip install -e ".[test]"` instead and skip this cell.
# %pip install -q "rlreason @ git+https://github.com/rlreason/rlreason@v0.1.0"

# %% tags=["parameters"]
# On a TPU runtime: REAL_MODEL = "/content/Qwen2.5-Math-1.5B" (a local HF
# directory: config.json + safetensors + tokenizer files) and a math dataset.
REAL_MODEL = ""
REAL_DATA = "hf:openai/gsm8k:config=main"
STEPS = 40  # the main job's default
WORKDIR = "workdirs/colab_quickstart"
# LoRA cell: rank of the adapters; "nf4" or "int8" holds the frozen base
# quantised (QLoRA), e.g. Qwen2.5-Math-1.5B on a 16 GB T4 or v5e-1.
LORA_RANK = 16
LORA_QUANTIZE = ""

# %%
import dataclasses
import json
import os

import matplotlib.pyplot as plt

from experiments import dr_grpo
from experiments import grpo
from rlreason.eval import evaluate
from rlreason import metrics
from rlreason import testing
from rlreason.eval import trained

overrides = dict(steps=STEPS, workdir=WORKDIR)
if REAL_MODEL:  # the paper's settings (experiments/grpo.py PAPER), one runtime
  overrides.update(
    model=REAL_MODEL,
    data=REAL_DATA,
    eval_data=f"{REAL_DATA},split=test",
    template="boxed",
    reward="math",
    warm_start_steps=0,
    dtype="bfloat16",
    max_prompt_len=256,
    max_new_tokens=512,
    lr=1e-6,
  )
if os.environ.get("RLREASON_NOTEBOOK_SMOKE") == "1":  # CI: seconds, not minutes
  overrides.update(testing.SMOKE)
cfg = dataclasses.replace(grpo.Config(), **overrides)
print(cfg)

# %% [markdown]
# ## Train
# GRPO from the shipped base (no warm start). The progress line shows
# reward, accuracy and the ETA; the workdir gets metrics.jsonl, TensorBoard
# events, a checkpoint, config.json and report.md with plots. Rerunning this
# cell resumes from the workdir's checkpoint.

# %%
out = grpo.run(cfg)
before = json.load(open(os.path.join(WORKDIR, "eval_before.json")))
print(
  f"held-out greedy accuracy: {before['eval/accuracy']:.3f} -> "
  f"{out['eval/accuracy']:.3f}"
)

# %% [markdown]
# ## Curves

# %%
rows = [
  r for r in metrics.read_jsonl(f"{WORKDIR}/metrics.jsonl") if "loss" in r
]
fig, axes = plt.subplots(1, 4, figsize=(16, 3))
for ax, key in zip(axes, ("reward", "accuracy", "length", "entropy")):
  ax.plot([r["step"] for r in rows], [r[key] for r in rows])
  ax.set_title(key)
  ax.set_xlabel("step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Sample from the trained policy
# `trained.load` reads the latest checkpoint with the run's recorded model,
# tokenizer and template; `evaluate` decodes greedily (and, with
# `samples=n`, reports pass@k / maj@k).

# %%
policy = trained.load(WORKDIR)
report = evaluate.evaluate(policy, num_problems=4)
print(report.table())
for prompt, texts in zip(report.prompts, report.greedy.texts):
  print(repr(prompt), "->", repr(texts[0]))

# %% [markdown]
# ## Another paper's method: one line
# Every experiment file has the same shape (`Config`, `run`); Dr. GRPO drops
# the std normalisation and the length-biased loss normaliser. The other
# experiments run on a shared testbed (`grpo.TinyConfig`: the "tiny" preset
# with a short supervised warm start, cached), not on the main job's base.

# %%
cfg2 = dataclasses.replace(
  dr_grpo.Config(), **{**overrides, "workdir": WORKDIR + "_dr_grpo"}
)
out2 = dr_grpo.run(cfg2)
print(f"Dr. GRPO held-out greedy accuracy: {out2['eval/accuracy']:.3f}")

# %% [markdown]
# ## LoRA: a real model on one accelerator
# `lora_rank` trains rank-r adapters on every linear map over a frozen base
# (held quantised with `lora_quantize`); the optimizer state covers the
# adapters only, and the KL reference is the base itself. On `REAL_MODEL`
# when one is given, else on the laptop model above. The adapters export in
# PEFT's format (`trained.export_peft`), the merged weights as an HF
# directory (`trained.export_hf`).

# %%
cfg3 = dataclasses.replace(
  grpo.Config(),
  **{**overrides, "workdir": WORKDIR + "_lora"},
  lora_rank=LORA_RANK,
  lora_quantize=LORA_QUANTIZE,
  lr=10 * cfg.lr,  # adapters take a larger step (README: LoRA)
)
out3 = grpo.run(cfg3)
print(f"LoRA GRPO held-out greedy accuracy: {out3['eval/accuracy']:.3f}")
adapter_dir = trained.export_peft(WORKDIR + "_lora", WORKDIR + "_lora/peft")
print("PEFT adapter:", sorted(os.listdir(adapter_dir)))
