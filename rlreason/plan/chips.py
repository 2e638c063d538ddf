"""TPU chips and slice names: HBM, peak bf16 FLOP/s, HBM and inter-chip
(ICI) bandwidth (and the local devices' peaks, GPUs' and TPUs', for
planning on them and a run's MFU: local_peaks).

  slice_ = chips.parse("v5p-128")   # -> Slice(chip=V5P, chips=64, ...)
  slice_.topology                   # "v5p:4x4x4" (jax.experimental.topologies)

Slice names follow Cloud TPU: v4-N and v5p-N count TensorCores (2 per chip,
one "megacore" device per chip), v5e-N (v5litepod-N) and v6e-N count chips.
Per-chip figures are the published ones (cloud.google.com/tpu/docs/v4,
/v5e, /v5p, /v6e).
"""

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bandwidth: float  # bytes/s
  cores_per_chip: int  # TensorCores the slice name counts per chip
  dims: int  # 3 (torus) or 2 (mesh) chip topology
  # Bidirectional ICI bytes/s per chip, all its links together (v4: six
  # links of 50 GB/s each way, the v4 paper; the others as published).
  ici_bandwidth: float = 0.0


CHIPS = {
  "v4": Chip("v4", 32 * GIB, 275e12, 1.2e12, 2, 3, 600e9),
  "v5e": Chip("v5e", 16 * GIB, 197e12, 0.819e12, 1, 2, 400e9),
  "v5p": Chip("v5p", 95 * GIB, 459e12, 2.765e12, 2, 3, 1200e9),
  "v6e": Chip("v6e", 32 * GIB, 918e12, 1.64e12, 1, 2, 800e9),
}
_ALIASES = {"v5litepod": "v5e", "v6": "v6e", "v5": "v5p"}

# GPUs, for the planner's "local" topology: (a substring of JAX's
# device_kind, dense bf16 FLOP/s, HBM bytes/s), most specific first;
# NVIDIA's datasheets (SXM parts unless named).
GPUS = (
  ("H100 PCIe", 756e12, 2.0e12),
  ("H100", 989e12, 3.35e12),
  ("H200", 989e12, 4.8e12),
  ("A100", 312e12, 2.039e12),
  ("L4", 121e12, 0.3e12),
)


# TPUs' JAX device_kind -> CHIPS (one megacore device per v4 / v5p chip),
# most specific first.
TPU_KINDS = (
  ("TPU v5 lite", "v5e"),
  ("TPU v5e", "v5e"),
  ("TPU v6 lite", "v6e"),
  ("TPU v6e", "v6e"),
  ("TPU v5p", "v5p"),
  ("TPU v5", "v5p"),
  ("TPU v4", "v4"),
)


def local_peaks(device) -> tuple[float, float] | None:
  """(peak bf16 FLOP/s, HBM bytes/s) of a local GPU or TPU device from its
  device_kind; None when unknown (CPU, other chips)."""
  kind = getattr(device, "device_kind", "")
  for name, flops, bandwidth in GPUS:
    if name in kind:
      return flops, bandwidth
  for name, family in TPU_KINDS:
    if kind.startswith(name):
      return CHIPS[family].peak_flops, CHIPS[family].hbm_bandwidth
  return None


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
