"""The smallest slice per PAPER preset and chip family, as a picture.

  cells = chart.grid(results, families)   # {(name, family): Cell}
  chart.plot(results, "slices.png", families)   # the README's heatmap

One row per preset, one column per family (search.FAMILIES; search's
write_table draws it beside table.md): a fit's cell is coloured by its
slice's chips (log scale) and names the slice and the roofline RL step; a
miss is grey with the largest slice tried; a preset not planned for a
family is blank. The PNG carries `digest(results, families)` in its
Description, so a test can tell a picture drawn from other results
(tests/plan/results_test.py).
"""

import hashlib
import json
import math
from typing import NamedTuple

from rlreason import storage
from rlreason.plan import chips
from rlreason.plan import summary


class Cell(NamedTuple):
  kind: str  # "fit", "miss" or "none"
  chips: int  # the slice's chips (0: none)
  text: str


def cell(row) -> Cell:
  if not row:
    return Cell("none", 0, "not planned")
  n = chips.parse(row["slice"]).chips
  if not summary.misses_by_memory(row):
    return Cell("miss", n, "not planned (error)")
  if not row.get("fits"):
    return Cell("miss", n, f"no fit up to {row['slice']}")
  return Cell("fit", n, f"{row['slice']}, {row['step_s']:.0f} s")


def grid(results: dict, families) -> dict:
  """{(name, family): Cell} for every preset in results and each family."""
  names = sorted({k.split("/")[0] for k in results})
  return {
    (n, f): cell(results.get(f"{n}/{f}")) for n in names for f in families
  }


def digest(results: dict, families) -> str:
  """A hash of what the picture shows (the grid's cells)."""
  cells = [[*key, *c] for key, c in sorted(grid(results, families).items())]
  return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def plot(results: dict, path, families) -> dict:
  """Draws grid(results) into `path` (PNG, local or gs://); the grid."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cells = grid(results, families)
  names = sorted({n for n, _ in cells})
  most = max([c.chips for c in cells.values() if c.kind == "fit"] or [2])
  norm = matplotlib.colors.Normalize(0, max(1.0, math.log2(most)))
  cmap = matplotlib.colors.ListedColormap(
    plt.get_cmap("YlOrRd")([0.1 + 0.8 * k / 255 for k in range(256)])
  )
  fig, ax = plt.subplots(figsize=(10, 1.2 + 0.27 * len(names)))
  for i, name in enumerate(names):
    for j, family in enumerate(families):
      c = cells[(name, family)]
      shade = norm(math.log2(c.chips)) if c.kind == "fit" else 0.0
      colour = {"fit": cmap(shade), "miss": "0.75", "none": "white"}[c.kind]
      ax.add_patch(
        plt.Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="0.9")
      )
      ink = "white" if shade > 0.6 else ("0.5" if c.kind == "none" else "k")
      ax.text(
        j + 0.5, i + 0.5, c.text, ha="center", va="center", fontsize=7,
        color=ink,
      )  # fmt: skip
  ax.set_xlim(0, len(families))
  ax.set_ylim(len(names), 0)
  ax.set_xticks([j + 0.5 for j in range(len(families))])
  ax.set_xticklabels(
    [
      f"{f} ({chips.CHIPS[f].hbm_bytes / chips.GIB:.0f} GiB/chip)"
      for f in families
    ]
  )
  ax.xaxis.tick_top()
  ax.set_yticks([i + 0.5 for i in range(len(names))])
  ax.set_yticklabels(names, fontsize=8)
  ax.tick_params(length=0)
  for side in ax.spines.values():
    side.set_visible(False)
  bar = fig.colorbar(
    plt.cm.ScalarMappable(cmap=cmap, norm=norm), ax=ax, fraction=0.03,
    pad=0.02,
  )  # fmt: skip
  ticks = range(int(norm.vmax) + 1)
  bar.set_ticks(list(ticks))
  bar.set_ticklabels([str(2**k) for k in ticks])
  bar.set_label("chips in the smallest slice that fits")
  ax.set_title(
    "Smallest TPU slice per PAPER preset with 15% of HBM free"
    " (slice, roofline RL step)",
    fontsize=10,
    pad=24,
  )
  fig.tight_layout()
  storage.save_figure(
    fig, path, dpi=100, metadata={"Description": digest(results, families)}
  )
  plt.close(fig)
  return cells
