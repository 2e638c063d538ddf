"""`plan --all`'s slice search, on a fake compiler (no libtpu needed)."""

import functools
import json
import os
import subprocess

import pytest

from rlreason.plan import chips
from rlreason.plan import search
from rlreason.plan import summary
from rlreason.train import train_step as ts

_env = dict(os.environ)
from experiments import plan as plan_cli  # noqa: E402 - sets libtpu's env
from experiments import plan_all  # noqa: E402
from experiments import plan_hooks  # noqa: E402

os.environ.clear()  # importing the CLI set libtpu's env for this process
os.environ.update(_env)

V4 = chips.sizes("v4")  # 4, 8, 16, ... chips of 32 GiB
OOM = "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm"


def fake(fits_from: int, error: str = OOM, fits_also=()):
  """try_slice for a preset that fits from `fits_from` chips up (and at
  the chip counts in `fits_also`), missing by `error` below."""
  calls = []

  def try_slice(s):
    calls.append(s.chips)
    if s.chips >= fits_from or s.chips in fits_also:
      return {"slice": s.name, "fits": True, "errors": {}}
    return {"slice": s.name, "fits": False, "errors": {"train_step": error}}

  return try_slice, calls


@pytest.mark.parametrize(
  "start, expected",
  [
    # From below it steps up to the first fit (after one step down from a
    # miss above the smallest slice); from above it steps down until the
    # first miss.
    (0, [4, 8, 16]),
    (1, [8, 4, 16]),
    (2, [16, 8]),
    (3, [32, 16, 8]),
    (5, [128, 64, 32, 16, 8]),
  ],
)
def test_the_search_finds_the_smallest_fit_from_any_start(start, expected):
  try_slice, calls = fake(fits_from=16)
  row, tried = search.smallest_fit(V4[:6], try_slice, start)
  assert row["slice"] == "v4-32" and row["fits"]  # 16 chips
  assert calls == expected
  assert tried == [f"v4-{2 * c}" for c in expected]


def test_a_fit_at_the_start_with_no_smaller_slice_costs_one_compile():
  try_slice, calls = fake(fits_from=1)
  row, tried = search.smallest_fit(V4, try_slice, 0)
  assert row["fits"] and calls == [4] and tried == ["v4-8"]


def test_no_fit_reports_the_largest_slice_tried():
  try_slice, calls = fake(fits_from=10**6)
  row, _ = search.smallest_fit(V4[:3], try_slice, 1)
  assert not row["fits"] and row["slice"] == "v4-32" and calls == [8, 4, 16]


def test_an_error_a_larger_slice_keeps_stops_the_search():
  try_slice, calls = fake(fits_from=16, error="ValueError: bad preset")
  row, _ = search.smallest_fit(V4, try_slice, 0)
  assert not row["fits"] and calls == [4]


def test_a_larger_slice_that_cannot_run_it_leaves_the_miss_below():
  """Out of memory up to 16 chips, then an error no larger slice changes
  (dr_grpo on v5e-256: its 128-row micro-batch does not split over 256
  chips): the answer is the miss at 16 chips, the error noted."""
  split = "ValueError: dimension 128 does not split 256 ways"

  def try_slice(s):
    if s.chips > 16:
      return {"slice": s.name, "fits": False, "errors": {"train_step": split}}
    return {"slice": s.name, "fits": False, "errors": {"train_step": OOM}}

  row, tried = search.smallest_fit(V4, try_slice, 1)
  assert tried == ["v4-16", "v4-8", "v4-32", "v4-64"]
  assert not row["fits"] and row["slice"] == "v4-32", row
  assert row["beyond"] == {"slice": "v4-64", "error": split}
  cell = search.markdown({"x/v4": row}, ("v4",)).splitlines()[-1]
  assert cell == f"| x | no fit up to v4-32 (v4-64: {split}) |"


def test_the_peak_floor_is_what_stays_per_chip():
  # knowrl on v5e (tried.json): 18.29 GiB on 16 chips, 16.27 on 32. With
  # peak = a + b / chips: b / 32 = 18.29 - 16.27 = 2.02, a = 14.25.
  assert search.peak_floor((16, 18.29), (32, 16.27)) == pytest.approx(
    14.25, rel=1e-9, abs=1e-9
  )
  # All of it split over the chips: the floor is 0.
  assert search.peak_floor((8, 40.0), (16, 20.0)) == pytest.approx(
    0.0, rel=1e-9, abs=1e-9
  )


def _compiled_misses(peaks):
  """try_slice whose every slice compiles its train step over the fit,
  at peaks[chips] GiB."""
  calls = []

  def try_slice(s):
    calls.append(s.chips)
    peak = peaks[s.chips]
    return {
      "slice": s.name,
      "fits": False,
      "errors": {},
      "peak_gib": peak,
      "step_s": 1.0,
      "train_s": 1.0,
    }

  return try_slice, calls


def test_misses_whose_peak_tends_over_the_fit_stop_the_search():
  """One row per chip from 8 chips up: 30 GiB at 8 chips and 29 at 16
  tend to 28 GiB, over a v4 chip's 27.2 GiB fit, so 32 chips and more
  are not compiled."""
  try_slice, calls = _compiled_misses({4: 32.0, 8: 30.0, 16: 29.0, 32: 1.0})
  row, tried = search.smallest_fit(
    V4, try_slice, 0, steady=lambda s: s.chips >= 8
  )
  assert calls == [4, 8, 16], calls
  assert row["slice"] == "v4-32" and not row["fits"]  # 16 chips
  assert row["floor_gib"] == pytest.approx(28.0, rel=1e-9, abs=1e-9)
  cell = search.markdown({"x/v4": row}, ("v4",)).splitlines()[-1]
  assert (
    "no fit up to v4-32 (one row per chip: the peak tends to 28.0 GiB" in cell
  )


def test_misses_are_extrapolated_only_where_rows_per_chip_cannot_fall():
  peaks = {4: 32.0, 8: 30.0, 16: 29.0, 32: 28.5, 64: 20.0}
  # Not steady: rows per chip still fall on larger slices.
  try_slice, calls = _compiled_misses(peaks)
  row, _ = search.smallest_fit(V4[:5], try_slice, 0, steady=lambda s: False)
  assert calls == [4, 8, 16, 32, 64] and "floor_gib" not in row
  # A floor under the fit (30 and 20 GiB tend to 10) goes on as well.
  try_slice, calls = _compiled_misses({4: 30.0, 8: 20.0, 16: 15.0})
  search.smallest_fit(V4[:3], try_slice, 0, steady=lambda s: True)
  assert calls == [4, 8, 16]


def test_one_row_per_chip_follows_the_split_micro_batch():
  # grpo's preset: 1024 rows in 32 micro-batches of 32.
  steady = functools.partial(plan_all.one_row_per_chip, "grpo")
  assert not steady(chips.parse("v4-16"))  # 8 chips: 4 rows each
  assert not steady(chips.parse("v4-32"))  # 16 chips: 2 each
  assert steady(chips.parse("v4-64"))  # 32 chips: 1 each
  # 64 chips: split into 16 micro-batches of 64 rows, one per chip.
  assert steady(chips.parse("v5p-128"))
  assert not steady(chips.parse("v4-64"), overrides={"micro_batches": 16})


def test_stepping_down_stops_at_the_first_miss():
  # Not monotone (the TPU scheduler: dler, treerl): 4 chips fit, 8 do not,
  # 16 do. From 16 the search stops at the miss at 8, as documented.
  try_slice, calls = fake(fits_from=16, fits_also=(4,))
  row, _ = search.smallest_fit(V4, try_slice, 2)
  assert row["slice"] == "v4-32" and calls == [16, 8]


def test_a_miss_at_the_start_tries_the_slice_below_first():
  # Not monotone the other way (igpo on v6e): 16 chips miss where 8 fit.
  # From 16 the search steps down once, finds 8, and goes on down from it.
  try_slice, calls = fake(fits_from=32, fits_also=(4, 8))
  row, _ = search.smallest_fit(V4, try_slice, 2)
  assert calls == [16, 8, 4] and row["slice"] == "v4-8", (calls, row)
  # The slice below misses too: up from the start, as before.
  try_slice, calls = fake(fits_from=16)
  row, _ = search.smallest_fit(V4, try_slice, 1)
  assert calls == [8, 4, 16] and row["slice"] == "v4-32"


def test_the_start_holds_the_least_memory_a_fit_used_elsewhere():
  gib = summary.GIB
  assert search.start_index(V4, []) == 0
  # 4 v5p chips at 60 GiB = 240 GiB: 8 v4 chips hold 8 x 27.2 = 217.6
  # GiB below the margin, 16 hold 435.2.
  assert search.start_index(V4, [(4, 60 * gib)]) == 2
  # The least of them: 8 x 20 = 160 GiB, over 4 v4 chips' 108.8.
  assert search.start_index(V4, [(4, 60 * gib), (8, 20 * gib)]) == 1
  assert search.start_index(V4, [(4, 27.2 * gib)]) == 0
  assert search.start_index(V4, [(64, 10**6 * gib)]) == len(V4) - 1


def _fake_rows(calls, fits_from: int, killed=()):
  """slice_row for a preset that fits from `fits_from` chips, whose
  compile is killed on the slices named in `killed`."""

  def slice_row(name, slice_name, programs, set_text):
    calls.append(slice_name)
    if slice_name in killed:
      return {
        "slice": slice_name,
        "fits": False,
        "errors": {"plan": plan_all.KILLED},
      }
    fits = chips.parse(slice_name).chips >= fits_from
    return {
      "slice": slice_name,
      "fits": fits,
      "errors": {},
      "peak_gib": 20.0 if fits else 30.0,
      "step_s": 2.0,
      "mfu": 0.5,
    }

  return slice_row


MISS = {"slice": "v4-8", "fits": False, "errors": {}}


@pytest.mark.parametrize(
  "seen, killed, expected_calls, expected_slice, fits",
  [
    # Resumed mid-search: v4-8's miss is not compiled again.
    ({"v4-8": MISS}, (), ["v4-16"], "v4-16", True),
    ({}, (), ["v4-8", "v4-16"], "v4-16", True),
    # v4-8's compile was killed (the host ran out of memory): a miss that
    # a larger slice is not tried for.
    ({}, ("v4-8",), ["v4-8"], "v4-8", False),
    # Searching down from v4-32 (a v5p fit of 4 x 60 GiB): v4-16's
    # compile was killed, so v4-32 is the answer and says so.
    ({}, ("v4-16",), ["v4-32", "v4-16"], "v4-32", True),
  ],
)
def test_plan_all_resumes_from_the_slices_tried(
  tmp_path, monkeypatch, seen, killed, expected_calls, expected_slice, fits
):
  calls = []
  fits_from = 16 if expected_slice == "v4-32" else 8
  monkeypatch.setattr(
    plan_all, "slice_row", _fake_rows(calls, fits_from, killed)
  )
  monkeypatch.setattr(plan_all, "fsdp_rollout", lambda *a: False)
  monkeypatch.setattr(plan_all, "candidate_slices", lambda *a: V4[:4])
  (tmp_path / "tried.json").write_text(json.dumps({"grpo/v4": seen}))
  if expected_slice == "v4-32":
    v5p = {"slice": "v5p-8", "fits": True, "peak_gib": 60.0, "step_s": 1.0}
    v5p.update(mfu=0.5, errors={})
    (tmp_path / "results.json").write_text(json.dumps({"grpo/v5p": v5p}))
  table = plan_all.plan_all(str(tmp_path), ["v4"], (), "", ("grpo",))
  assert calls == expected_calls
  # The table has every family's column, not only the searched one's.
  assert table.splitlines()[0] == "| experiment | v4 | v5p | v5e | v6e |"
  row = json.loads((tmp_path / "results.json").read_text())["grpo/v4"]
  assert row["slice"] == expected_slice and row["fits"] == fits
  tried = json.loads((tmp_path / "tried.json").read_text())["grpo/v4"]
  assert set(tried) == set(seen) | set(expected_calls)
  if not fits:
    assert row["errors"]["plan"] == plan_all.KILLED
    assert "killed" in table
  elif expected_slice == "v4-32":
    assert row["killed"] == ["v4-16"]
    assert "v4-16: compile killed, not decided" in table
  else:
    assert "v4-16: " in table and "killed" not in table


def test_a_rollout_gathering_its_weights_is_also_planned_tensor_parallel(
  tmp_path, monkeypatch
):
  """grpo's 7B bf16 weights take over 40% of a 32 GiB chip: its rollout
  splits them over fsdp (gathered every decode step). Each slice is also
  compiled with --mesh_tensor=2 and 4 (its 4 KV heads split 4 ways) and
  the fastest fit kept, the others' verdicts beside it; on v5p (95 GiB)
  the weights are replicated, one compile."""
  assert plan_all.fsdp_rollout("grpo", "v4-16", {})
  assert not plan_all.fsdp_rollout("grpo", "v5p-8", {})
  assert not plan_all.fsdp_rollout("grpo", "v4-16", {"mesh_tensor": 2})
  assert not plan_all.fsdp_rollout("grpo", "v4-16", {"rollout_layout": "fsdp"})
  # The sampler's own split (--rollout_tensor) decides, whatever training's.
  assert not plan_all.fsdp_rollout("grpo", "v4-16", {"rollout_tensor": 2})
  assert plan_all.fsdp_rollout(
    "grpo", "v4-16", {"mesh_tensor": 2, "rollout_tensor": 1}
  )
  calls = []

  assert plan_all.tensor_splits("grpo", "v4-16", {}) == (
    "mesh_tensor=2", "mesh_tensor=4", "rollout_tensor=4",
  )  # fmt: skip
  assert plan_all.tensor_splits("grpo", "v4-8", {}) == (  # 4 chips
    "mesh_tensor=2", "rollout_tensor=2",
  )  # fmt: skip
  assert plan_all.tensor_splits("grpo", "v5p-8", {}) == ()
  assert plan_all.tensor_splits("grpo", "v4-16", {"mesh_tensor": 2}) == ()
  assert plan_all.tensor_splits("grpo", "v4-16", {"rollout_tensor": 4}) == ()
  calls = []
  # At --mesh_tensor=4 slower than at 2; the sampler's own split of 4
  # (training unsplit) slower still.
  steps = {"": 40.0, "mesh_tensor=2": 3.0, "mesh_tensor=4": 5.0}
  steps |= {"rollout_tensor=4": 6.0, "rollout_tensor=2": 7.0}

  def slice_row(name, slice_name, programs, set_text):
    calls.append((slice_name, set_text))
    fits = chips.parse(slice_name).chips >= 8
    row = {"slice": slice_name, "fits": fits, "errors": {}}
    row.update(peak_gib=20.0, step_s=steps[set_text], mfu=0.5)
    if set_text:
      flag, value = set_text.split("=")
      row[flag] = int(value)
    return row

  monkeypatch.setattr(plan_all, "slice_row", slice_row)
  monkeypatch.setattr(plan_all, "candidate_slices", lambda *a: V4[:4])
  plan_all.plan_all(str(tmp_path), ["v4"], (), "", ("grpo",))
  assert calls == [
    ("v4-8", ""), ("v4-8", "mesh_tensor=2"),  # 4 chips: all miss
    ("v4-8", "rollout_tensor=2"),
    ("v4-16", ""), ("v4-16", "mesh_tensor=2"), ("v4-16", "mesh_tensor=4"),
    ("v4-16", "rollout_tensor=4"),
  ]  # fmt: skip
  row = json.loads((tmp_path / "results.json").read_text())["grpo/v4"]
  assert row["slice"] == "v4-16" and row["mesh_tensor"] == 2, row
  fit = {"fits": True, "peak_gib": 20.0, "errors": {}}
  assert row["alternative"] == {
    **fit, "step_s": 6.0, "rollout_tensor": 4,
    "alternative": {
      **fit, "step_s": 5.0, "mesh_tensor": 4,
      "alternative": {**fit, "step_s": 40.0},
    },
  }  # fmt: skip
  tried = json.loads((tmp_path / "tried.json").read_text())["grpo/v4"]
  misses = tried["v4-8"]["alternative"]  # the last first, then the one before
  assert misses["rollout_tensor"] == 2, misses
  assert misses["alternative"]["mesh_tensor"] == 2, misses
  assert not tried["v4-8"]["fits"] and "mesh_tensor" not in tried["v4-8"]
  # Both fit: the shorter step; both miss: the first.
  a = {"fits": True, "step_s": 5.0}
  b = {"fits": True, "step_s": 9.0, "mesh_tensor": 2}
  assert search.faster(a, b)["step_s"] == 5.0
  assert search.faster(b, a)["step_s"] == 5.0
  # A row without the ICI bound (planned before it) loses to one with it.
  bound = {**b, "ici_s": {"rollout": 1.0}}
  assert search.faster(a, bound)["step_s"] == 9.0
  assert search.faster(bound, a)["alternative"]["step_s"] == 5.0
  assert search.faster({**a, "ici_s": {}}, bound)["step_s"] == 5.0
  miss = {"fits": False, "step_s": 1.0}
  assert (
    search.faster(miss, {**miss, "mesh_tensor": 2}).get("mesh_tensor") is None
  )


def test_a_single_slice_plan_merges_into_the_results(tmp_path):
  """--merge: a re-plan of the cell's slice replaces it as `faster` keeps
  it (the ICI bound beats a row planned before it; the search's notes on
  the slices beyond stay); a fit on a smaller slice becomes the cell; a
  miss or a larger slice goes to tried.json alone."""
  old = {"slice": "v4-16", "fits": True, "step_s": 5.0, "peak_gib": 20.0}
  old.update(mfu=0.5, errors={}, commit="a")
  (tmp_path / "results.json").write_text(
    json.dumps({"grpo/v4": {**old, "beyond": {"slice": "v4-8"}}})
  )
  (tmp_path / "tried.json").write_text(json.dumps({"grpo/v4": {"v4-16": old}}))
  new = {**old, "step_s": 9.0, "mesh_tensor": 2, "ici_s": {"rollout": 1.0}}
  kept = search.merge_row(str(tmp_path), "grpo", new)
  assert kept["step_s"] == 9.0 and kept["alternative"]["commit"] == "a"

  def files():
    return [
      json.loads((tmp_path / f).read_text())["grpo/v4"]
      for f in ("results.json", "tried.json")
    ]

  results, tried = files()
  assert tried["v4-16"] == kept
  assert results == {**kept, "beyond": {"slice": "v4-8"}}
  assert "| grpo | v4-16: 20.0 GiB" in (tmp_path / "table.md").read_text()
  # The table marks the cells the caller's `unbounded` names.
  search.merge_row(str(tmp_path), "grpo", new, lambda results: set(results))
  marked = f"step 9.0 s ({search.UNBOUNDED})"
  assert marked in (tmp_path / "table.md").read_text()
  # A miss on a smaller slice, a fit on a larger one: tried.json only.
  search.merge_row(
    str(tmp_path), "grpo", {**new, "slice": "v4-8", "fits": False}
  )
  search.merge_row(str(tmp_path), "grpo", {**new, "slice": "v4-32"})
  results, tried = files()
  assert results["slice"] == "v4-16" and set(tried) == {
    "v4-8",
    "v4-16",
    "v4-32",
  }
  # A fit on a smaller slice is the cell now (the miss there beside it).
  small = {**new, "slice": "v4-8", "step_s": 20.0}
  kept = search.merge_row(str(tmp_path), "grpo", small)
  assert kept == {**small, "alternative": {**kept["alternative"]}}
  assert kept["alternative"]["fits"] is False
  results, tried = files()
  assert results == kept == tried["v4-8"]


def test_fits_without_the_ici_bound_are_listed_where_the_rollout_gathers():
  """grpo's 7B bf16 weights are over 40% of a v4 chip (its rollout splits
  them over fsdp), not of a v5p chip, unless --rollout_layout=fsdp; split
  2 ways (--mesh_tensor, or the sampler's own --rollout_tensor) they are
  replicated; a row with `ici_s` has the bound, a miss has no step."""
  fit = {"fits": True, "slice": "v4-16", "step_s": 1.0, "peak_gib": 20.0}
  fit.update(mfu=0.5, errors={})
  results = {
    "grpo/v4": fit,
    "grpo/v5p": {**fit, "slice": "v5p-8"},
    "dapo/v5p": {**fit, "slice": "v5p-8", "rollout_layout": "fsdp"},
    "rloo/v4": {
      **fit,
      "mesh_tensor": 2,
      "sequence_parallel": True,
      "remat_policy": "offload",
    },
    "siren/v4": {**fit, "rollout_tensor": 2},  # the sampler's own split
    "dump/v4": {**fit, "ici_s": {"rollout": 9.0}},
    "ppo/v4": {**fit, "fits": False},
  }
  assert plan_all.unbounded(results) == {"v4": ["grpo"], "v5p": ["dapo"]}
  assert plan_all.unbounded_text(results) == "v4 (1): grpo; v5p (1): dapo"
  # table.md marks their steps, and only theirs.
  keys = plan_all.unbounded_keys(results)
  assert keys == {"grpo/v4", "dapo/v5p"}
  table = search.markdown(results, ("v4", "v5p"), keys).splitlines()
  marked = [line for line in table if search.UNBOUNDED in line]
  assert [line.split(" | ")[0] for line in marked] == ["| dapo", "| grpo"]
  assert (
    f"v4-16: 20.0 GiB, step 1.0 s ({search.UNBOUNDED}), MFU 50%" in marked[1]
  )
  assert search.UNBOUNDED not in search.markdown(results, ("v4", "v5p"))
  # The README's tables: one per family, of its presets alone, marked
  # likewise.
  tables = search.family_tables(results, ("v4", "v5p"), keys)
  v4, v5p = tables.split("v5p (95 GiB per chip):")
  assert v4.startswith("v4 (32 GiB per chip):\n\n| experiment | v4 |")
  rows = lambda t: [x.split(" | ")[0][2:] for x in t.splitlines()[4:] if x]  # noqa: E731
  assert rows(v4) == ["dump", "grpo", "ppo", "rloo", "siren"]
  # A boolean flag as the run takes it; a model setting through --set.
  (rloo,) = [x for x in v4.splitlines() if x.startswith("| rloo")]
  assert rloo.endswith(
    "(--mesh_tensor=2 --sequence_parallel --remat_policy=offload) |"
  ), rloo
  assert rows(v5p) == ["dapo", "grpo"]
  v4_marked = [x for x in v4.splitlines() if search.UNBOUNDED in x]
  v5p_marked = [x for x in v5p.splitlines() if search.UNBOUNDED in x]
  assert [x.split(" | ")[0] for x in v4_marked + v5p_marked] == [
    "| grpo",
    "| dapo",
  ]


def test_set_parses_numbers_and_booleans_as_absl_does():
  got = plan_hooks.parse_set("mesh_tensor=8,lr=1e-6,sequence_parallel=true")
  assert got == {"mesh_tensor": 8, "lr": 1e-6, "sequence_parallel": True}
  assert plan_hooks.parse_set("remat=False,model=/ckpt/x,") == {
    "remat": False, "model": "/ckpt/x",
  }  # fmt: skip
  assert search.run_flag("remat", False) == "--noremat"


def test_a_slice_whose_child_fails_is_a_row_with_its_error():
  row = plan_all.slice_row("no_such_experiment", "v5e-4", ("train_step",), "")
  assert row["slice"] == "v5e-4" and not row["fits"]
  assert "no_such_experiment" in row["errors"]["plan"], row


@pytest.mark.parametrize("code", [-9, -15, -2])
def test_a_child_killed_is_a_miss_and_one_stopped_stops_the_search(
  monkeypatch, code
):
  def run(cmd, **kwargs):
    return subprocess.CompletedProcess(cmd, code, "", "Killed")

  monkeypatch.setattr(plan_all.subprocess, "run", run)
  if code == -9:  # SIGKILL: the OOM killer
    row = plan_all.slice_row("grpo", "v4-8", ("train_step",), "")
    assert row["errors"]["plan"] == plan_all.KILLED and not row["fits"]
  else:  # SIGTERM / SIGINT: stopped by hand, nothing to record
    with pytest.raises(KeyboardInterrupt):
      plan_all.slice_row("grpo", "v4-8", ("train_step",), "")


def test_a_micro_batch_that_does_not_split_is_named_in_the_cell():
  """4 rows per micro-batch on 16 chips: XLA keeps activations whole on
  groups of chips (adacl's v4-32 cell, train MFU 29%); the row says so,
  and the cell too. 16 rows on the same chips split."""
  cfg = plan_hooks.experiment_config("grpo", "paper", {})[0]
  rows = cfg.num_sequences // (cfg.minibatches * cfg.micro_batches)
  assert ts.unsplit(cfg, rows) == ""
  assert ts.unsplit(cfg, 1) == ""
  why = ts.unsplit(cfg, 2 * rows)
  assert (
    why == f"{rows} rows per micro-batch do not split over {2 * rows} chips"
  )
  slice_name = f"v4-{4 * rows}"  # 2 * rows chips (two cores per chip)
  assert plan_hooks.unsplit_on("grpo", slice_name) == why
  assert plan_hooks.unsplit_on("grpo", f"v4-{2 * rows}") == ""
  row = {"slice": slice_name, "fits": True, "errors": {}, "peak_gib": 20.0}
  row.update(step_s=2.0, mfu=0.3, unsplit=why)
  cell = search.markdown({"grpo/v4": row}, ("v4",)).splitlines()[-1]
  assert cell.endswith(f"MFU 30% ({why}) |"), cell


def test_a_fitting_plan_is_told_its_micro_batch_does_not_split():
  from rlreason.plan import program as program_lib

  cfg = plan_hooks.experiment_config("grpo", "paper", {})[0]
  rows = cfg.num_sequences // (cfg.minibatches * cfg.micro_batches)
  fits = {
    "train_step": program_lib.Program("train_step", 1, 0, 0, 1, 0, 0, 0, [])
  }
  knob = (
    f"train_step: {ts.unsplit(cfg, 2 * rows)} (activations kept whole on "
    f"groups of chips): --micro_batches={cfg.micro_batches // 2}, or"
  )
  advice = summary.advice(fits, {}, cfg, 100 << 30, 2 * rows)
  assert [a for a in advice if a.startswith(knob)], advice
  assert summary.advice(fits, {}, cfg, 100 << 30, rows) == []


def test_a_slice_that_does_not_split_the_micro_batch_is_planned_with_fewer():
  cfg = plan_hooks.experiment_config("grpo", "paper", {})[0]
  rows = cfg.num_sequences // (cfg.minibatches * cfg.micro_batches)
  two_rows = f"v4-{4 * rows}"  # 2 * rows chips: one row each
  fewer = cfg.micro_batches // 2
  assert plan_hooks.split_overrides("grpo", "paper", two_rows, {}) == {
    "micro_batches": fewer
  }
  assert plan_hooks.unsplit_on("grpo", two_rows, {"micro_batches": fewer}) == ""
  # Where the preset's split, nothing is added to the overrides.
  assert plan_hooks.split_overrides("grpo", "paper", "v4-8", {"seed": 3}) == {}
  assert (
    plan_hooks.split_overrides(
      "grpo", "paper", two_rows, {"micro_batches": fewer}
    )
    == {}
  )
  row = {"slice": two_rows, "fits": True, "errors": {}, "peak_gib": 20.0}
  row.update(step_s=2.0, mfu=0.7, micro_batches=fewer)
  cell = search.markdown({"grpo/v4": row}, ("v4",)).splitlines()[-1]
  assert cell.endswith(f"MFU 70% (--micro_batches={fewer}) |"), cell


@pytest.mark.parametrize(
  "name, prompt, completion, decoded",
  # 4 turns of 500 tokens and 3 observations of 500; 4 x 1024 and 3 x 512;
  # the rollout decodes the actions (0: all of a single-turn completion).
  [
    ("search_r1", 2048, 3500, 2000),
    ("igpo", 2048, 3500, 2000),
    ("toolrl", 1024, 5632, 4096),
    ("grpo", 512, 1024, 0),
  ],
)
def test_multi_turn_presets_are_planned_at_their_episode_length(
  name, prompt, completion, decoded
):
  cfg, _, _ = plan_hooks.experiment_config(name, "paper", {})
  assert (cfg.max_prompt_len, cfg.max_new_tokens) == (prompt, completion)
  assert plan_hooks.hook(name, "decode_tokens", cfg) == decoded


def test_igpo_plans_token_advantages_and_its_answer_forwards():
  cfg, _, extras = plan_hooks.experiment_config("igpo", "paper", {})
  assert extras["fields"] == {"adv": (cfg.max_new_tokens,)}
  assert plan_hooks.hook("igpo", "score_forwards", cfg) == cfg.max_turns == 4
  assert plan_hooks.hook("search_r1", "score_forwards", cfg) == 0


def test_ampo_plans_its_teachers_and_their_candidates_forward():
  """PAPER: four teacher models sampling one solution each for every
  prompt (a program.Sampler of 4 models, at the policy's rollout with
  --teacher_samples per prompt); the student's log-probs of the 4 + 1
  (stored solution) candidates per prompt are one forward of N = 8 rows
  per prompt; with 3 x 3 + 1 candidates per prompt of 8 rows, two."""
  from rlreason.plan import program as program_lib

  cfg, _, extras = plan_hooks.experiment_config("ampo", "paper", {})
  ((name, sampler),) = extras["samplers"].items()
  assert name == "teachers" and isinstance(sampler, program_lib.Sampler)
  assert sampler.models == 4 and cfg.group_size == 8
  assert sampler.config.group_size == cfg.teacher_samples == 1
  assert sampler.config.model == cfg.model
  assert sampler.config.max_new_tokens == cfg.max_new_tokens
  assert plan_hooks.hook("ampo", "score_forwards", cfg) == 1
  three = dict(teachers="a,b,c,reference", teacher_samples=3)
  cfg3, _, extras3 = plan_hooks.experiment_config("ampo", "paper", three)
  assert extras3["samplers"]["teachers"].models == 3
  assert plan_hooks.hook("ampo", "score_forwards", cfg3) == 2
  stored, _, none = plan_hooks.experiment_config(
    "ampo", "paper", dict(teachers="reference")
  )
  assert none["samplers"] == {}
  assert plan_hooks.hook("ampo", "score_forwards", stored) == 1


def test_a_row_names_its_peak_program_and_the_budgets_refused():
  from rlreason.plan import program as program_lib

  def prog(name, temp_mib, note=""):
    return program_lib.Program(
      name, 1 << 20, 0, 0, temp_mib << 20, 0, 0, 0, [], note=note
    )

  refused = "with --train_temp_budget_mib=100: RESOURCE_EXHAUSTED: no"
  s = summary.Summary(
    peak_bytes=301 << 20, hbm_bytes=1 << 30, fits=True, margin=0.7,
    step_seconds=2.0, train_seconds=1.0, mfu=0.5, errors={},
    programs={"rollout": prog("rollout", 100),
              "train_step": prog("train_step", 300, refused)},
    advice=[],
  )  # fmt: skip
  row = plan_cli._row(s, "v5e-4")
  assert row["peak_of"] == "train_step"
  assert row["notes"] == {"train_step": refused}
  s.programs["train_step"].note = ""
  assert "notes" not in plan_cli._row(s, "v5e-4")


def test_a_row_takes_the_smallest_budget_its_forwards_were_planned_under():
  """The whole-rollout forwards share --score_temp_budget_mib (the run
  compiles each under the one flag): the row needs the smallest budget
  any of them was planned under; the train step's and the rollout's
  each their own; the flags that the table prints list it once."""
  from rlreason.plan import program as program_lib

  def prog(name, budget):
    return program_lib.Program(
      name, 1 << 20, 0, 0, 1 << 20, 0, 0, 0, [], temp_budget_mib=budget
    )

  s = summary.Summary(
    peak_bytes=2 << 20, hbm_bytes=1 << 30, fits=True, margin=0.9,
    step_seconds=2.0, train_seconds=1.0, mfu=0.5, errors={},
    programs={"train_step": prog("train_step", 900),
              "rollout": prog("rollout", 0),
              "ref_logp": prog("ref_logp", 700),
              "teacher": prog("teacher", 500),
              "values": prog("values", 0)},
    advice=[],
  )  # fmt: skip
  row = plan_cli._row(s, "v5e-4")
  assert row["train_temp_budget_mib"] == 900
  assert row["score_temp_budget_mib"] == 500
  assert "rollout_temp_budget_mib" not in row
  assert search.ROW_FLAGS.count("score_temp_budget_mib") == 1
  row.update(slice="v5e-4", step_s=2.0)
  cell = search.markdown({"grpo/v5e": row}, ("v5e",)).splitlines()[-1]
  assert "(--train_temp_budget_mib=900 --score_temp_budget_mib=500)" in cell


def test_a_row_names_the_default_where_a_config_budget_was_for_another_chip():
  """A program kept at the compiler's default because the config's budget
  was over the fit says --flag=0 in the run (retry.compile_one); another
  program planned under a budget of the same flag (rm_grpo's reward
  model's train step shares the policy's) keeps that budget."""
  from rlreason.plan import program as program_lib

  def prog(name, budget=0, run_flags=None):
    return program_lib.Program(
      name, 1 << 20, 0, 0, 1 << 20, 0, 0, 0, [], temp_budget_mib=budget,
      run_flags=run_flags or {},
    )  # fmt: skip

  default = {"train_temp_budget_mib": 0, "micro_batches": 4}
  s = summary.Summary(
    peak_bytes=2 << 20, hbm_bytes=1 << 30, fits=True, margin=0.9,
    step_seconds=2.0, train_seconds=1.0, mfu=0.5, errors={},
    programs={"train_step": prog("train_step", 0, default),
              "rollout": prog("rollout")},
    advice=[],
  )  # fmt: skip
  row = plan_cli._row(s, "v6e-16")
  assert row["train_temp_budget_mib"] == 0 and row["micro_batches"] == 4
  row.update(slice="v6e-16", step_s=2.0)
  cell = search.markdown({"ppo/v6e": row}, ("v6e",)).splitlines()[-1]
  assert "--train_temp_budget_mib=0" in cell, cell
  s.programs["reward_model_train"] = prog("reward_model_train", 300)
  assert plan_cli._row(s, "v6e-16")["train_temp_budget_mib"] == 300


@pytest.mark.parametrize(
  "flags, message",
  [
    (dict(experiment="nosuch"), "--experiment: unknown nosuch; expected one"),
    (dict(all=True, experiments="grpo,nope"), "--experiments: unknown nope"),
    (dict(scale="big"), "--scale=big: expected laptop or paper"),
    (dict(topology="v9-16"), "--topology: Unknown TPU slice 'v9-16'"),
    (dict(topology="v5e-3"), "--topology: v5e-3: v5e slices come in sizes"),
    (dict(overrides={"nosuch": 1}), "--set: nosuch not a field of"),
  ],
)
def test_the_planner_cli_names_a_bad_flag_before_compiling(flags, message):
  from absl import app
  import types

  values = dict(
    experiment="grpo", experiments="", all=False, scale="paper",
    topology="v5e-16",
  )  # fmt: skip
  overrides = flags.pop("overrides", {})
  f = types.SimpleNamespace(**{**values, **flags})
  with pytest.raises(app.UsageError, match=message):
    plan_cli.check_flags(f, overrides)
  plan_cli.check_flags(types.SimpleNamespace(**values), {"micro_batches": 4})
