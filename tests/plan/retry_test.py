"""aot.compile_run's retries under a temporaries budget, on a fake compiler
(the CPU's mesh, a program that is out of HBM at the compiler's default):
the decisions, not libtpu's numbers (tests/plan/plan_test.py has those)."""

import dataclasses

import pytest

from experiments import grpo
from rlreason import mesh as mesh_lib
from rlreason.plan import aot
from rlreason.plan import program as program_lib
from rlreason.rl import objective

MIB = 1 << 20
OOM = "RESOURCE_EXHAUSTED: Ran out of memory on HBM (fake)"


@pytest.fixture
def fake_tpu(monkeypatch):
  """A reference forward that needs 900 MiB of temporaries at the
  compiler's default (out of HBM) and `budget` MiB under a budget of at
  least 100 MiB (refused below); budgets as a TPU mesh would take them."""
  tried = []

  def compile_ref_logp(cfg, model_cfg, mesh, rows):
    budget = cfg.score_temp_budget_mib
    tried.append(budget)
    if budget == 0 or budget < 100:
      raise RuntimeError(OOM)
    return program_lib.Program(
      "ref_logp", 50 * MIB, 0, 0, budget * MIB, 0, 0.0, 0.0, [],
      rows=rows, temp_budget_mib=budget,
    )  # fmt: skip

  monkeypatch.setattr(aot.scoring, "compile_ref_logp", compile_ref_logp)
  monkeypatch.setattr(
    aot.ts, "compiler_options", lambda mib, mesh: {"budget": mib}
  )
  return tried


def _run(fit_bytes):
  cfg = dataclasses.replace(
    grpo.TinyConfig(), batch_size=2, group_size=2, micro_batches=1, steps=1
  )
  mesh = mesh_lib.make_mesh(1, -1, 1)
  return aot.compile_run(
    cfg,
    objective.loss_fn,
    mesh,
    programs=("ref_logp",),
    hbm_bytes=1 << 40,
    fit_bytes=fit_bytes,
  )["ref_logp"]


def test_a_forward_out_of_hbm_at_the_default_is_compiled_under_a_budget(
  fake_tpu,
):
  """No program came back to read its arguments from: the first budget
  is the fit less what stays resident; a compile over the fit lowers it
  by the overshoot (the 50 MiB of arguments), and that one is kept."""
  prog = _run(1000 * MIB)
  resident = prog.resident_bytes
  first = (1000 * MIB - resident) >> 20
  assert fake_tpu == [0, first, first - 50], fake_tpu
  assert prog.temp_budget_mib == first - 50
  assert prog.peak_bytes <= 1000 * MIB
  assert prog.resident_bytes == resident > 0


def test_a_forward_no_budget_holds_keeps_the_compilers_refusal(fake_tpu):
  """Room for less than the 100 MiB the fake needs: the error names the
  default's refusal and the budget's."""
  resident = _run(1000 * MIB).resident_bytes
  fake_tpu.clear()
  err = _run(resident + 60 * MIB)  # a 60 MiB budget: refused
  assert isinstance(err, RuntimeError), err
  assert str(err).startswith(OOM), err
  assert "with --score_temp_budget_mib=" in str(err), err
  assert fake_tpu == [0, 60], fake_tpu
