"""colab/ notebooks run top to bottom as scripts with their tiny defaults."""

import glob
import os
import subprocess
import sys

import jupytext
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.py")))


def test_there_are_notebooks():
  assert [os.path.basename(p) for p in NOTEBOOKS] == [
    "quickstart.py",
    "reproduce_table.py",
  ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_ipynb_is_paired_and_in_sync(path):
  """The .ipynb Colab opens has exactly the cells of the .py source."""
  ipynb = path[: -len(".py")] + ".ipynb"
  assert os.path.exists(ipynb), f"run: jupytext --sync {path}"
  src = jupytext.read(path)
  nb = jupytext.read(ipynb)
  assert [(c.cell_type, c.source) for c in src.cells] == [
    (c.cell_type, c.source) for c in nb.cells
  ], f"{ipynb} is stale: jupytext --sync {path}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_runs_as_a_script(path, tmp_path):
  env = {
    **os.environ,
    "RLREASON_NOTEBOOK_SMOKE": "1",
    "MPLBACKEND": "Agg",
    "PYTHONPATH": ROOT,
  }
  out = subprocess.run(
    [sys.executable, path],
    cwd=tmp_path,  # workdirs/ land in the temporary directory
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
