"""TPU slice names -> chips and chip grids. The chips' figures (HBM, peak
bf16 FLOP/s, HBM and inter-chip (ICI) bandwidth: CHIPS) and the local
devices' peaks (local_peaks) are rlreason/devices.py's, importable here.

  slice_ = chips.parse("v5p-128")   # -> Slice(chip=V5P, chips=64, ...)
  slice_.topology                   # "v5p:4x4x4" (jax.experimental.topologies)

Slice names follow Cloud TPU: v4-N and v5p-N count TensorCores (2 per chip,
one "megacore" device per chip), v5e-N (v5litepod-N) and v6e-N count chips.
Per-chip figures are the published ones (cloud.google.com/tpu/docs/v4,
/v5e, /v5p, /v6e).
"""

import dataclasses

# The chips' figures and the local devices' peaks live with the devices
# (layer 0: a run's MFU reads them too); the names stay importable here.
from rlreason.devices import CHIPS  # noqa: F401
from rlreason.devices import GIB  # noqa: F401
from rlreason.devices import GPUS  # noqa: F401
from rlreason.devices import Chip  # noqa: F401
from rlreason.devices import local_peaks  # noqa: F401

_ALIASES = {"v5litepod": "v5e", "v6": "v6e", "v5": "v5p"}


# Chips -> chip grid of the standard slice shapes.
_GRIDS_3D = {
  4: "2x2x1",
  8: "2x2x2",
  16: "2x2x4",
  32: "2x4x4",
  64: "4x4x4",
  128: "4x4x8",
  256: "4x8x8",
  512: "8x8x8",
  1024: "8x8x16",
  2048: "8x16x16",
  4096: "16x16x16",
}
_GRIDS_2D = {
  1: "1x1",
  4: "2x2",
  8: "2x4",
  16: "4x4",
  32: "4x8",
  64: "8x8",
  128: "8x16",
  256: "16x16",
}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # "v5p-128"
  chip: Chip
  chips: int

  @property
  def topology(self) -> str:
    grids = _GRIDS_3D if self.chip.dims == 3 else _GRIDS_2D
    return f"{self.chip.name}:{grids[self.chips]}"

  @property
  def hbm_bytes(self) -> int:
    return self.chip.hbm_bytes


def parse(name: str) -> Slice:
  """A slice from its Cloud TPU name ("v4-32", "v5e-16", "v5litepod-8")."""
  family, sep, count = name.lower().partition("-")
  family = _ALIASES.get(family, family)
  if not sep or family not in CHIPS or not count.isdigit():
    raise ValueError(
      f"Unknown TPU slice {name!r}; expected <chip>-<size> with chip in "
      f"{sorted(CHIPS)} (e.g. v5p-128, v5e-16)"
    )
  chip = CHIPS[family]
  chips = int(count) // chip.cores_per_chip
  grids = _GRIDS_3D if chip.dims == 3 else _GRIDS_2D
  if int(count) % chip.cores_per_chip or chips not in grids:
    sizes = [c * chip.cores_per_chip for c in grids]
    raise ValueError(f"{name}: {family} slices come in sizes {sizes}")
  return Slice(f"{family}-{count}", chip, chips)


def sizes(family: str) -> list[Slice]:
  """Every standard slice of a chip family, smallest first."""
  chip = CHIPS[family]
  grids = _GRIDS_3D if chip.dims == 3 else _GRIDS_2D
  return [parse(f"{family}-{c * chip.cores_per_chip}") for c in grids]


def devices(slice_: Slice):
  """Abstract TPU devices of the slice (libtpu's compiler; no TPU needed).

  Needs `pip install "jax[tpu]"` and, on a host without TPUs, the env
  TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES set (plan.aot.tpu_env).
  """
  from jax.experimental import topologies

  kwargs = {}
  if slice_.chip.cores_per_chip == 2:
    kwargs["chip_config_name"] = "megacore"  # one device per chip
  if slice_.chips < 4:
    # Below a host's default 2x2 chips (v5e-1: the Colab TPU runtime).
    grid = [int(d) for d in slice_.topology.split(":")[1].split("x")]
    kwargs["chips_per_host_bounds"] = (grid + [1, 1])[:3]
  topo = topologies.get_topology_desc(
    topology_name=slice_.topology, platform="tpu", **kwargs
  )
  return topo.devices
