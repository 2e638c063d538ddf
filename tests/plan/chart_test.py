"""The slices picture (rlreason/plan/chart.py): what each cell shows, and
the digest the PNG carries of it."""

from PIL import Image

from rlreason.plan import chart
from rlreason.plan import search

FIT = {"slice": "v4-16", "fits": True, "step_s": 110.87, "peak_gib": 27.18}
FIT.update(mfu=0.75, errors={}, commit="a")
MISS = {**FIT, "slice": "v5e-64", "fits": False, "errors": {}}
ERROR = {**FIT, "slice": "v6e-8", "fits": False}
ERROR["errors"] = {"train_step": "the batch does not split over 8 shards"}


def test_a_cell_names_the_slice_and_step_or_why_not():
  cells = chart.grid(
    {"grpo/v4": FIT, "grpo/v5e": MISS, "grpo/v6e": ERROR, "rloo/v5p": FIT},
    search.FAMILIES,
  )
  assert set(cells) == {
    (n, f) for n in ("grpo", "rloo") for f in search.FAMILIES
  }
  # v4 counts TensorCores: v4-16 is 8 chips.
  assert cells[("grpo", "v4")] == chart.Cell("fit", 8, "v4-16, 111 s")
  assert cells[("grpo", "v5e")] == chart.Cell("miss", 64, "no fit up to v5e-64")
  assert cells[("grpo", "v6e")].kind == "miss"
  assert cells[("grpo", "v6e")].text == "not planned (error)"
  assert cells[("grpo", "v5p")] == chart.Cell("none", 0, "not planned")


def test_the_digest_follows_what_the_picture_shows():
  results = {"grpo/v4": FIT}
  same = {"grpo/v4": {**FIT, "commit": "b", "mfu": 0.5}}  # not drawn
  moved = {"grpo/v4": {**FIT, "slice": "v4-32"}}
  slower = {"grpo/v4": {**FIT, "step_s": 200.0}}
  digest = lambda r: chart.digest(r, search.FAMILIES)  # noqa: E731
  assert digest(results) == digest(same)
  assert digest(results) != digest(moved)
  assert digest(results) != digest(slower)


def test_write_table_draws_the_picture_beside_table_md(tmp_path):
  big = {**FIT, "slice": "v5p-256"}  # 128 chips: the colour scale's top
  results = {"grpo/v4": FIT, "grpo/v5e": MISS, "truncated_ppo/v5p": big}
  search.write_table(str(tmp_path), results)
  assert "| grpo | v4-16: 27.18 GiB" in (tmp_path / "table.md").read_text()
  png = Image.open(tmp_path / "slices.png")
  assert png.format == "PNG"
  assert png.text["Description"] == chart.digest(results, search.FAMILIES)
  # One row per preset: the picture grows with the presets planned.
  many = {f"e{i}/v4": FIT for i in range(20)}
  search.write_table(str(tmp_path), many)
  taller = Image.open(tmp_path / "slices.png")
  assert taller.size[1] > png.size[1]
  assert taller.text["Description"] == chart.digest(many, search.FAMILIES)
