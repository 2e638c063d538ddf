"""The entropy-performance law R = -a exp(H) + b, fitted and plotted.

The Entropy Mechanism of RL for Reasoning LMs (Cui et al. 2025,
arXiv:2505.22617): across a run without entropy intervention, the
policy's performance R and its entropy H follow
    R = -a exp(H) + b,
so performance is bought with entropy and its ceiling is R(H = 0) = b - a.
The law is linear in (a, b) given x = exp(H), so least squares on
[-exp(H), 1] fits it exactly (the paper fits the same two coefficients).

  a, b = fit(entropy, reward)
  entropy_law.write(workdir)   # entropy_law.json + entropy_law.png

`write` reads metrics.jsonl: the per-step training `entropy` (token-mean
entropy of the policy on its own rollouts) against the training `accuracy`
(or `reward`) of the same step.
"""

from typing import NamedTuple, Sequence

import numpy as np
from etils import epath

from rlreason import metrics as metrics_lib
from rlreason import storage


class Fit(NamedTuple):
  a: float
  b: float
  r2: float  # coefficient of determination of the fit
  n: int  # points fitted

  @property
  def ceiling(self) -> float:
    """Predicted performance at zero entropy, b - a."""
    return self.b - self.a

  def predict(self, entropy) -> np.ndarray:
    return -self.a * np.exp(np.asarray(entropy, np.float64)) + self.b


def fit(entropy: Sequence[float], performance: Sequence[float]) -> Fit:
  """Least-squares (a, b) of performance = -a exp(entropy) + b.

  Args:
    entropy: [K] entropies H_k (nats).
    performance: [K] the performance R_k at the same points.

  Returns:
    Fit(a, b, r2, n). With fewer than 2 distinct exp(H) the slope is
    undetermined: a = 0, b = mean(R).
  """
  h = np.asarray(entropy, np.float64)
  r = np.asarray(performance, np.float64)
  if h.shape != r.shape or h.ndim != 1:
    raise ValueError(f"entropy {h.shape} and performance {r.shape} differ")
  ok = np.isfinite(h) & np.isfinite(r)
  h, r = h[ok], r[ok]
  if len(h) == 0:
    raise ValueError("no finite (entropy, performance) points to fit")
  x = np.exp(h)
  if len(np.unique(x)) < 2:
    return Fit(0.0, float(r.mean()), 0.0, len(h))
  design = np.stack([-x, np.ones_like(x)], axis=1)
  (a, b), *_ = np.linalg.lstsq(design, r, rcond=None)
  resid = r - design @ np.array([a, b])
  total = ((r - r.mean()) ** 2).sum()
  r2 = 1.0 - (resid**2).sum() / total if total > 0 else 1.0
  return Fit(float(a), float(b), float(r2), len(h))


def points(
  rows: list[dict], key: str = "accuracy"
) -> tuple[np.ndarray, np.ndarray]:
  """(entropy [K], performance [K]) of the training rows with both keys."""
  pts = [
    (r["entropy"], r[key])
    for r in rows
    if isinstance(r.get("entropy"), (int, float))
    and isinstance(r.get(key), (int, float))
  ]
  if not pts:
    return np.zeros(0), np.zeros(0)
  h, p = map(np.asarray, zip(*pts))
  return h, p


def plot(
  entropy: np.ndarray,
  performance: np.ndarray,
  result: Fit,
  path: epath.PathLike,
  *,
  ylabel: str = "accuracy",
  title: str = "",
) -> None:
  """Scatter of (H, R) with the fitted curve, saved as a PNG."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 4))
  order = np.arange(len(entropy))
  sc = ax.scatter(entropy, performance, c=order, cmap="viridis", s=14)
  fig.colorbar(sc, ax=ax, label="RL step (order)")
  if len(entropy):
    grid = np.linspace(min(0.0, entropy.min()), entropy.max(), 100)
    ax.plot(
      grid,
      result.predict(grid),
      color="C3",
      lw=2,
      label=(
        f"R = -{result.a:.3g} exp(H) + {result.b:.3g}  (R^2 {result.r2:.2f})"
      ),
    )
    ax.legend(fontsize=8)
  ax.set_xlabel("policy entropy H (nats)")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.set_title(title or "Entropy-performance law")
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)


def write(workdir: str, *, key: str = "accuracy", title: str = "") -> dict:
  """Fits the law on workdir/metrics.jsonl; writes entropy_law.{json,png}.

  Returns:
    The JSON written: a, b, r2, n, ceiling (b - a) and the key used; empty
    when the run logged no (entropy, key) pairs.
  """
  run = epath.Path(workdir)
  rows = metrics_lib.read_jsonl(run / "metrics.jsonl")
  h, p = points(rows, key)
  if not len(h):
    return {}
  result = fit(h, p)
  out = {**result._asdict(), "ceiling": result.ceiling, "key": key}
  storage.write_json(run / "entropy_law.json", out)
  plot(
    h,
    p,
    result,
    run / "entropy_law.png",
    ylabel=f"train {key}",
    title=title,
  )
  return out
