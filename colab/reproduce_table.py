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
# # Reproduce a paper's claim as a table
#
# `experiments/reproduce.py` holds one `Claim` per paper method: the
# experiment variants to compare, the metric that carries the claim, and the
# expected outcome. This notebook runs one claim for a few seeds and shows
# the table and the curves it writes, exactly as
# `python -m experiments.reproduce --method=<name> --seeds=0,1,2` does, on
# the shipped pretrained base (TESTBED = "base", the main job's model and
# data) or on the tiny warm-started model the claims were first run on
# ("tiny").
# Runs are resumable: rerun a cell after an interruption and finished runs
# are reused.

# %%
# Install a pinned version (Colab). From a local checkout use
# `pip install -e ".[test]"` instead and skip this cell.
# %pip install -q "rlreason @ git+https://github.com/rlreason/rlreason@v0.1.0"

# %% tags=["parameters"]
METHOD = "dr_grpo"  # any key of reproduce.CLAIMS
SEEDS = (0, 1, 2)
STEPS = 0  # 0 = each experiment's laptop default
TESTBED = "base"  # "base" | "tiny" (experiments/reproduce.py's docstring)
ROOT = None  # None: workdirs/reproduce/<TESTBED>
COMMON = {}  # Config overrides for every run, e.g. {"model": "/ckpt/..."}

# %%
import os

from experiments import reproduce
from rlreason import testing

try:  # In a notebook: rendered; as a plain script: printed.
  from IPython.display import Image
  from IPython.display import Markdown
  from IPython.display import display
except ImportError:
  Image = Markdown = str
  display = print

if os.environ.get("RLREASON_NOTEBOOK_SMOKE") == "1":  # CI: seconds
  SEEDS, STEPS, TESTBED = (0,), 2, "tiny"
  COMMON = {k: v for k, v in testing.SMOKE.items() if k != "steps"}

print("claims:", ", ".join(sorted(reproduce.CLAIMS)))
claim = reproduce.CLAIMS[METHOD]
print(claim.claim)
print("expected:", claim.expected)
for label in claim.variants:
  module, overrides = claim.overrides(label, TESTBED)
  print(f"  {label}: experiments.{module} {overrides}")

# %% [markdown]
# ## Run every variant x seed (resumable)

# %%
results_md = reproduce.run_all(
  METHOD,
  claim,
  SEEDS,
  steps=STEPS,
  root=ROOT,
  common=COMMON,
  testbed_name=TESTBED,
)

# %% [markdown]
# ## The table and the curves

# %%
display(Markdown(open(results_md).read()))
display(Image(os.path.join(os.path.dirname(results_md), "curves.png")))
