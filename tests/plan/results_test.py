"""The versioned plan results agree with each other and with the README.

`plan --all` writes experiments/plan_results/ (results.json: the smallest
fit per preset and family; tried.json: every slice compiled; table.md:
their tables) and the README's tables are pasted from table.md: a cell
edited in one place only fails here.
"""

import json
import os

import pytest

from experiments import plan_all
from experiments import plan_hooks
from rlreason.plan import chart
from rlreason.plan import chips
from rlreason.plan import search

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "plan_results")


def _load(name):
  with open(os.path.join(RESULTS, name)) as f:
    return json.load(f)


RESULTS_JSON = _load("results.json")
TRIED_JSON = _load("tried.json")
UNBOUNDED_KEYS = plan_all.unbounded_keys(RESULTS_JSON)


def test_the_readme_holds_the_family_tables():
  """The README's tables are `search.family_tables` of results.json: a cell
  edited in one place only fails here (table.md holds them to paste)."""
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  tables = search.family_tables(RESULTS_JSON, search.FAMILIES, UNBOUNDED_KEYS)
  assert tables in readme, "paste the family tables of table.md"
  # Every fit is a cell of its family's table, with the flags it needs.
  for key, row in RESULTS_JSON.items():
    if row.get("fits"):
      cell = f"| {key.split('/')[0]} | {row['slice']}: {row['peak_gib']} GiB"
      assert cell in tables, cell
      line = next(x for x in tables.splitlines() if x.startswith(cell))
      assert f"step {row['step_s']} s" in line, line
      assert f"MFU {100 * row['mfu']:.0f}%" in line, line
      for flag in search.ROW_FLAGS:
        if flag in row:
          assert search.run_flag(flag, row[flag]) in line, (flag, line)


def test_the_slices_picture_is_of_these_results():
  """slices.png (the README's picture) was drawn from results.json as it
  is: `search.write_table` draws it whenever it writes table.md."""
  from PIL import Image

  png = Image.open(os.path.join(RESULTS, "slices.png"))
  assert png.text["Description"] == chart.digest(
    RESULTS_JSON, search.FAMILIES
  ), "redraw it: search.write_table(experiments/plan_results, results)"


@pytest.mark.parametrize("key", sorted(TRIED_JSON))
def test_a_searched_cell_is_its_tried_slice(key):
  if key not in RESULTS_JSON:  # only misses so far: none dropped a fit
    fits = [n for n, r in TRIED_JSON[key].items() if r["fits"]]
    assert not fits, f"{key}: {fits} fit but results.json has no cell"
    return
  row = dict(RESULTS_JSON[key])
  row.pop("killed", None)  # added by the search, not by the compile
  beyond = row.pop("beyond", None)  # likewise: the next slice's error
  floor = row.pop("floor_gib", None)  # likewise: the misses' extrapolation
  assert TRIED_JSON[key][row["slice"]] == row
  if beyond:
    errors = TRIED_JSON[key][beyond["slice"]]["errors"]
    assert beyond["error"] in errors.values()
  if floor is not None:  # from this miss and the one below it
    misses = sorted(
      (chips.parse(n).chips, r["peak_gib"])
      for n, r in TRIED_JSON[key].items()
      if not r["fits"] and r.get("peak_gib")
    )
    assert misses[-1] == (chips.parse(row["slice"]).chips, row["peak_gib"])
    assert round(search.peak_floor(*misses[-2:]), 2) == floor
  if not row["fits"]:
    return
  # The search recorded a smaller slice than its answer only as a miss.
  answer = chips.parse(row["slice"]).chips
  for name, tried in TRIED_JSON[key].items():
    if chips.parse(name).chips < answer:
      assert not tried["fits"], f"{key}: {name} fits below {row['slice']}"


def test_table_md_is_the_results_table():
  with open(os.path.join(RESULTS, "table.md")) as f:
    assert f.read() == search.tables(RESULTS_JSON, UNBOUNDED_KEYS)


@pytest.mark.parametrize("key", sorted(RESULTS_JSON))
def test_a_cell_says_whether_its_micro_batch_splits(key):
  """`unsplit` is derived from the preset (and the row's --micro_batches),
  not compiled: a cell whose preset's micro-batch changed since it was
  planned fails here."""
  row = RESULTS_JSON[key]
  name = key.split("/")[0]
  overrides = {  # the row's flags that change the batch's split
    k: row[k] for k in ("micro_batches", "mesh_tensor") if k in row
  }
  assert row.get("unsplit", "") == plan_hooks.unsplit_on(
    name, row["slice"], overrides
  )


def test_the_readme_lists_the_fits_without_the_ici_bound():
  """plan_all.unbounded: fits planned before the ICI bound whose rollout
  gathers its weights every decode step (their steps far too short); the
  README names each until it is planned again."""
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = " ".join(f.read().split())
  listed = plan_all.unbounded_text(RESULTS_JSON)
  total = sum(len(v) for v in plan_all.unbounded(RESULTS_JSON).values())
  every = "Every fit in the tables now has the ICI bound"
  if not total:
    assert every in readme
    return
  assert every not in readme, listed
  assert listed in readme, listed
  verb = "is" if total == 1 else "are"
  assert f"The other {total} {verb} kept as compiled" in readme, total
