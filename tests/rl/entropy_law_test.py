"""Tests for rlreason.rl.entropy_law: the R = -a exp(H) + b fit."""

import json
import os

import numpy as np
import pytest

from rlreason.rl import entropy_law


def test_recovers_exact_coefficients():
  h = np.array([0.1, 0.3, 0.5, 0.9, 1.2])
  r = -0.5 * np.exp(h) + 1.2
  out = entropy_law.fit(h, r)
  np.testing.assert_allclose([out.a, out.b], [0.5, 1.2], rtol=1e-10, atol=1e-12)
  assert out.r2 == pytest.approx(1.0, rel=1e-10, abs=1e-12)
  assert out.n == 5
  # R(H = 0) = b - a
  assert out.ceiling == pytest.approx(0.7, rel=1e-10, abs=1e-12)
  np.testing.assert_allclose(out.predict([0.0]), [0.7], rtol=1e-10, atol=1e-12)


def test_least_squares_by_hand():
  # x = exp(H) = 1, e, e^2 and R = 1, 0, 0: the normal equations of
  # R = -a x + b give a = (mean(x) mean(R) - mean(x R)) / var(x).
  h = np.array([0.0, 1.0, 2.0])
  r = np.array([1.0, 0.0, 0.0])
  x = np.exp(h)
  a = (x.mean() * r.mean() - (x * r).mean()) / x.var()
  b = r.mean() + a * x.mean()
  out = entropy_law.fit(h, r)
  np.testing.assert_allclose([out.a, out.b], [a, b], rtol=1e-10, atol=1e-12)


def test_degenerate_inputs():
  out = entropy_law.fit([0.5, 0.5, np.nan], [0.2, 0.4, 1.0])
  assert (out.a, out.b, out.n) == (
    0.0,
    pytest.approx(0.3, rel=1e-10, abs=1e-12),
    2,
  )
  with pytest.raises(ValueError):
    entropy_law.fit([np.nan], [1.0])


def test_write_reads_the_metrics_and_plots(tmp_path):
  rows = [
    {"step": s, "entropy": h, "accuracy": -0.2 * np.exp(h) + 0.9}
    for s, h in enumerate([1.0, 0.8, 0.6, 0.5, 0.4], start=1)
  ]
  rows.append({"step": 5, "eval/accuracy": 0.5})  # eval rows are skipped
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  out = entropy_law.write(str(tmp_path))
  assert out["n"] == 5 and out["a"] == pytest.approx(0.2, rel=1e-10, abs=1e-12)
  assert os.path.exists(tmp_path / "entropy_law.png")
  with open(tmp_path / "entropy_law.json") as f:
    assert json.load(f)["b"] == pytest.approx(0.9, rel=1e-10, abs=1e-12)
  assert entropy_law.write(str(tmp_path), key="missing") == {}
