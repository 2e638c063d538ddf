"""Reading an optimized HLO module's text (as `compiled.as_text()` prints
it): its computations and instructions, an HLO shape's bytes and the
memory space of each array in it, and a while loop's trip count.

  comps, entry = hlo_text.parse(text)  # {computation: [Instruction]}
  hlo_text.shape_bytes("(s32[], f32[2,3]{1,0})")  # 28.0
  hlo_text.trips(comps, loop, named)  # N - start of `counter < N`, or None

plan/hlo_loops.py counts a program's bytes with it; plan/program.py names
its largest buffers.
"""

import dataclasses
import math
import re

_DTYPE_BYTES = {
  "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
  "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
  "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*)$")
_NAME = re.compile(r"%([^\s,(){}]+)")
# An array in the host's memory space: its layout's memory space S(5)
# (XLA's kHostMemorySpace, as TPU layouts print it).
HOST_SPACE = "S(5)"
_LAID_OUT = re.compile(r"\b([a-z]\w*)\[([\d,]*)\](\{[^}]*\})?")


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape's arrays (a tuple's summed; f8 types 1 byte)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
    total += size * math.prod(int(d) for d in dims.split(",") if d)
  return total


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str
  op: str
  operands: tuple[str, ...]
  attrs: str
  root: bool


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """{computation: instructions} of an HLO module's text, and ENTRY's name."""
  comps: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for line in text.splitlines():
    m = _COMPUTATION.match(line)
    if m and not line.startswith(" "):
      current = comps.setdefault(m.group(1), [])
      if line.startswith("ENTRY"):
        entry = m.group(1)
      continue
    m = _INSTRUCTION.match(line)
    if m is None or current is None:
      continue
    root, name, shape, op, rest = m.groups()
    close = rest.find(")")
    args = rest[: close if close >= 0 else len(rest)]
    current.append(
      Instruction(name, shape, op, tuple(_NAME.findall(args)), rest, bool(root))
    )
  return comps, entry


def attr(inst: Instruction, key: str) -> list[str]:
  m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%[^\s,]+)", inst.attrs)
  return _NAME.findall(m.group(1)) if m else []


def branches(inst: Instruction) -> list[str]:
  """A conditional's branch computations (indexed, or true / false)."""
  return attr(inst, "branch_computations") or (
    attr(inst, "true_computation") + attr(inst, "false_computation")
  )


def trips(comps, loop: Instruction, named=None) -> int | None:
  """A while loop's trip count: XLA's known_trip_count where it annotated
  one (CPU, GPU), else N - start of a condition `counter < N` (TPU's
  programs carry no annotation): compare(counter, constant(N)),
  direction=LT, or a fusion of that compare; start is the counter's
  initial value where `named` ({name: instruction} of the module) shows
  it as a constant (1 where XLA peeled the first trip out of the loop),
  else 0."""
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
  if m:
    return int(m.group(1))
  insts = {
    i.name: i for i in comps.get((attr(loop, "condition") or [""])[0], [])
  }
  root = next((i for i in insts.values() if i.root), None)
  bound = counter = None
  if root is not None and root.op == "compare" and len(root.operands) == 2:
    if "direction=LT" in root.attrs:
      counter, bound = (insts.get(o) for o in root.operands)
  elif root is not None and root.op == "fusion":
    fused = comps.get((attr(root, "calls") or [""])[0], [])
    cmp = next((i for i in fused if i.root), None)
    params = {
      i.name: int(re.match(r"\s*(\d+)", i.attrs).group(1))
      for i in fused
      if i.op == "parameter"
    }
    if (
      cmp is not None
      and cmp.op == "compare"
      and "direction=LT" in cmp.attrs
      and len(cmp.operands) == 2
      and params.get(cmp.operands[1], len(root.operands)) < len(root.operands)
    ):
      bound = insts.get(root.operands[params[cmp.operands[1]]])
      at = params.get(cmp.operands[0], len(root.operands))
      if at < len(root.operands):
        counter = insts.get(root.operands[at])
  if bound is None or bound.op != "constant":
    return None
  m = re.match(r"\s*(-?\d+)\s*\)", bound.attrs)
  if m is None:
    return None
  return max(int(m.group(1)) - _start(loop, counter, named or {}), 0)


def _start(loop: Instruction, counter, named) -> int:
  """The initial value of a loop's counter (the condition's
  get-tuple-element `counter`) where the loop's init tuple holds it as a
  constant (through copies); else 0."""
  if counter is None or counter.op != "get-tuple-element" or not loop.operands:
    return 0
  index = re.search(r"index=(\d+)", counter.attrs)
  init = named.get(loop.operands[0])
  if index is None or init is None or init.op != "tuple":
    return 0
  k = int(index.group(1))
  value = named.get(init.operands[k]) if k < len(init.operands) else None
  while value is not None and value.op == "copy" and value.operands:
    value = named.get(value.operands[0])
  if value is None or value.op != "constant":
    return 0
  m = re.match(r"\s*(-?\d+)\s*\)", value.attrs)
  return int(m.group(1)) if m else 0


def laid_out(shape: str) -> list[tuple[float, bool]]:
  """(bytes, in the host's memory) of each array of an HLO shape."""
  return [
    (shape_bytes(f"{t}[{d}]"), HOST_SPACE in layout)
    for t, d, layout in _LAID_OUT.findall(shape)
  ]
