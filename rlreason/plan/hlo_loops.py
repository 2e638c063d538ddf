"""Bytes a compiled program moves, with its loops' trip counts multiplied.

XLA's cost_analysis counts a while loop's body once, whatever its trip
count: the micro-batch scan of a train step, and the loops nested in it
(the logits chunks, blockwise attention, SIREN's nucleus bisection) not
at all beyond their first pass. This reads the optimized HLO text and
estimates each instruction's bytes the way XLA's cost model does (operands
read + result written; a fusion reads only the slices it takes of an
operand and writes only the update of an in-place dynamic-update-slice),
once with every loop body counted once (`flat`, what cost_analysis counts)
and once with each body times its trip count (`looped`, nested loops
multiplied):

  est = hlo_loops.estimate(compiled.as_text())
  bytes_per_step = xla_bytes * est.looped / est.flat

A loop's trip count is XLA's annotation (CPU, GPU) or read from its
condition (`counter < N`, as lax.scan and fori_loop lower on TPU), less
the counter's start where the loop's init holds it as a constant (XLA
peels a scan's first trip out of the loop and starts it at 1: a scan of
4 layers is one peeled trip and a loop of 3); a condition of another
form counts once (`est.unknown` names those loops).
Only the program's own loops are multiplied (lax.scan / fori_loop /
while_loop, whose op_name ends in "while"): the loops XLA's partitioner
makes itself (a windowed einsum's collective matmul over a sharded
weight) count once, as cost_analysis counts them. Multiplying those too
gave grpo's 7B train step on v6e-16 2.6x the bytes (47 vs 18 TB of this
estimate per step); whether such a body, as counted, is one window's
share or more is not settled without a TPU to measure, so they stay as
XLA counts them.

`est.ici` is the bytes each device sends over the inter-chip links per
step (collectives: an all-gather or reduce-scatter over a group of n
devices moves (n - 1) / n of the whole array, an all-reduce twice that,
an all-to-all (n - 1) / n of its operand, a collective-permute its
operand), every loop multiplied out, XLA's own too: the windowed
einsum's loop permutes one shard per trip. A loop whose trip count is
not read (a sampler's decode loop, which stops when every row has)
counts once; `est.ici_unread` is that share, for the caller to scale
(plan/summary.py: by the decode steps). `estimate(text, apart=scope)`
leaves out of it the collectives under a name scope (an op_name path
component), and the whole of any unread loop made under it:
`est.ici_apart`, one pass's (continuous batching's refills, named
"refill", run a prefill per `refill_rows` rows, not one per decode step).

`est.host` is the bytes each device copies between its memory and its
host's (an array in XLA's host memory space, "S(5)" in a TPU layout:
--remat_policy=offload's saved layer inputs, written in the forward and
read back in the backward), every loop multiplied out: an async or plain
copy, dynamic-slice or dynamic-update-slice whose source and result lie
on either side counts the bytes that cross (the slice, the update).
"""

import dataclasses
import functools
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
# Instructions that move no bytes of their own (or whose called
# computations are counted instead).
_FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
  "after-all", "partition-id", "replica-id", "opt-barrier",
  "add-dependency", "while", "call", "conditional",
}  # fmt: skip
_SLICES = {"slice", "dynamic-slice"}
# An array in the host's memory space: its layout's memory space S(5)
# (XLA's kHostMemorySpace, as TPU layouts print it).
_HOST_SPACE = "S(5)"
_LAID_OUT = re.compile(r"\b([a-z]\w*)\[([\d,]*)\](\{[^}]*\})?")


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape's arrays (a tuple's summed; f8 types 1 byte)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
    total += size * math.prod(int(d) for d in dims.split(",") if d)
  return total


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  shape: str
  op: str
  operands: tuple[str, ...]
  attrs: str
  root: bool


@dataclasses.dataclass(frozen=True)
class Estimate:
  flat: float  # every loop body once (as cost_analysis counts)
  looped: float  # each body times its trip count
  loops: tuple[tuple[str, int], ...]  # (body, trip count) of each own loop
  unknown: tuple[str, ...]  # bodies whose trip count was not read
  partitioner_loops: int = 0  # loops XLA made (counted once)
  ici: float = 0.0  # bytes sent to other devices, each loop multiplied out
  # Of `ici`, the bytes inside loops whose trip count was not read (a
  # sampler's decode loop, which stops when every row has): one trip's,
  # its conditionals' cheapest branches (a refill is not every step's).
  ici_unread: float = 0.0
  # Of `ici`, the bytes under estimate's `apart` name scope, one pass of
  # each loop they are in (not in ici_unread).
  ici_apart: float = 0.0
  # Bytes copied between the device's memory and its host's, each loop
  # multiplied out (a loop whose trip count is not read: once).
  host: float = 0.0

  @property
  def factor(self) -> float:
    """looped / flat (1 without loops)."""
    return self.looped / self.flat if self.flat else 1.0


def parse(text: str) -> tuple[dict[str, list[_Instruction]], str]:
  """{computation: instructions} of an HLO module's text, and ENTRY's name."""
  comps: dict[str, list[_Instruction]] = {}
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
      _Instruction(
        name, shape, op, tuple(_NAME.findall(args)), rest, bool(root)
      )
    )
  return comps, entry


def _attr(inst: _Instruction, key: str) -> list[str]:
  m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%[^\s,]+)", inst.attrs)
  return _NAME.findall(m.group(1)) if m else []


# Collectives (and their async starts): bytes each device sends, as a
# multiple of its operands' bytes, for a group of n devices.
_COLLECTIVES = {
  "all-gather": lambda n: n - 1,  # the operand is one device's shard
  "reduce-scatter": lambda n: (n - 1) / n,
  "all-reduce": lambda n: 2 * (n - 1) / n,  # reduce-scatter + all-gather
  "all-to-all": lambda n: (n - 1) / n,
  "collective-permute": lambda n: 1.0,
  "collective-broadcast": lambda n: 1.0,
}
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")


def group_size(attrs: str) -> int:
  """Devices in each of a collective's replica groups: a list of groups
  ({{0,1,2,3},...}), an iota ([groups, size]<=[N]) or mesh axes
  (mesh['a'=2,'b'=4] {'b'}); 0 where none is named."""
  m = _MESH_GROUPS.search(attrs)
  if m:
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
    named = re.findall(r"'([^']+)'", m.group(2))
    return math.prod(int(sizes[a]) for a in named)
  m = _IOTA_GROUPS.search(attrs)
  if m:
    return int(m.group(1).split(",")[-1])
  m = _LIST_GROUPS.search(attrs)
  if m:
    return len([d for d in m.group(1).split(",") if d])
  return 0


def sent_bytes(op: str, operand_bytes: float, n: int) -> float:
  """Bytes one device sends for a collective `op` (or its -start) over
  operands of `operand_bytes` in groups of n (0 for other ops)."""
  base = op.removesuffix("-start")
  if base not in _COLLECTIVES or (n <= 1 and base != "collective-permute"):
    return 0.0
  return _COLLECTIVES[base](n) * operand_bytes


def _trips(comps, loop: _Instruction, named=None) -> int | None:
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
    i.name: i for i in comps.get((_attr(loop, "condition") or [""])[0], [])
  }
  root = next((i for i in insts.values() if i.root), None)
  bound = counter = None
  if root is not None and root.op == "compare" and len(root.operands) == 2:
    if "direction=LT" in root.attrs:
      counter, bound = (insts.get(o) for o in root.operands)
  elif root is not None and root.op == "fusion":
    fused = comps.get((_attr(root, "calls") or [""])[0], [])
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


def _start(loop: _Instruction, counter, named) -> int:
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


def _op_name(inst: _Instruction) -> str:
  m = re.search(r'op_name="([^"]*)"', inst.attrs)
  return m.group(1) if m else ""


def _own(loop: _Instruction) -> bool:
  """A loop the program wrote (lax.scan, fori_loop, while_loop lower to
  an op_name ending in "while"), not one XLA's partitioner made."""
  name = _op_name(loop)
  return not name or name.rsplit("/", 1)[-1] == "while"


def _under(inst: _Instruction, scope: str) -> bool:
  """Whether inst's op_name has `scope` as a path component."""
  return bool(scope) and scope in _op_name(inst).split("/")


def estimate(text: str, apart: str = "") -> Estimate:
  comps, entry = parse(text)
  named = {i.name: i for insts in comps.values() for i in insts}
  loops, unknown, made = [], [], set()

  def fusion_bytes(inst, shapes) -> float:
    """Operands as read inside the fused computation, and its result
    (an in-place dynamic-update-slice writes only its update)."""
    called = (_attr(inst, "calls") or [""])[0]
    body = comps.get(called, [])
    params, users = {}, {}
    for i in body:
      if i.op == "parameter":
        m = re.match(r"\s*(\d+)", i.attrs)
        params[i.name] = int(m.group(1)) if m else -1
      for o in i.operands:
        users.setdefault(o, []).append(i)
    by_name = {i.name: i for i in body}
    root = next((i for i in body if i.root), None)
    in_place = set()
    out = shape_bytes(inst.shape)
    if root is not None and root.op == "dynamic-update-slice":
      target = root.operands[0] if root.operands else ""
      if target in params and len(root.operands) > 1:
        in_place.add(params[target])
        update = by_name.get(root.operands[1])
        out = shape_bytes(update.shape) if update else out
    total = out
    for name, index in params.items():
      if index in in_place or index >= len(inst.operands):
        continue
      uses = users.get(name, [])
      if uses and all(u.op in _SLICES and u.operands[0] == name for u in uses):
        total += sum(shape_bytes(u.shape) for u in uses)
      else:
        total += shapes.get(inst.operands[index], 0.0)
    return total

  @functools.cache
  def computation_bytes(name: str, looped: bool) -> float:
    shapes = {}
    total = 0.0
    for inst in comps.get(name, []):
      shapes[inst.name] = shape_bytes(inst.shape)
      if inst.op == "while":
        body = (_attr(inst, "body") or [""])[0]
        cond = (_attr(inst, "condition") or [""])[0]
        own = _own(inst)
        n = _trips(comps, inst, named) if own else 1
        if not looped:
          if not own:
            made.add(body)
          elif n is None:
            unknown.append(body)
          if own:
            loops.append((body, n or 1))
        each = computation_bytes(body, looped) + computation_bytes(cond, looped)
        total += each * ((n or 1) if looped else 1)
      elif inst.op == "call":
        total += sum(
          computation_bytes(c, looped) for c in _attr(inst, "to_apply")
        )
      elif inst.op == "conditional":
        branches = _attr(inst, "branch_computations") or (
          _attr(inst, "true_computation") + _attr(inst, "false_computation")
        )
        total += max(
          (computation_bytes(c, looped) for c in branches), default=0
        )
      elif inst.op == "fusion":
        total += fusion_bytes(inst, shapes)
      elif inst.op not in _FREE and not inst.op.endswith("-done"):
        total += shapes[inst.name] + sum(
          shapes.get(o, 0.0) for o in inst.operands
        )
    return total

  @functools.cache
  def computation_ici(name: str) -> tuple[float, float, float, float]:
    """Bytes sent by `name`'s collectives, each loop times its trips:
    (with each conditional's costliest branch, with its cheapest, of the
    cheapest the share inside loops whose trip count was not read, once
    per trip: a decode loop's steady step, its rare branches, such as
    continuous batching's refills, left to the once-counted rest; and of
    the cheapest those under `apart`, one pass of their loops)."""
    shapes, hi, lo, unread, aside = {}, 0.0, 0.0, 0.0, 0.0
    for inst in comps.get(name, []):
      shapes[inst.name] = shape_bytes(inst.shape)
      if inst.op == "while":
        body = (_attr(inst, "body") or [""])[0]
        b_hi, b_lo, b_unread, b_aside = computation_ici(body)
        n = _trips(comps, inst, named)
        if n is None and _under(inst, apart):
          b_aside = b_lo  # the loop is the scope's: all of it apart
        hi += b_hi * (n or 1)
        lo += b_lo * (n or 1)
        unread += b_lo - b_aside if n is None else b_unread * n
        aside += b_aside * (n or 1)
      elif inst.op in ("call", "conditional", "fusion", "async-start"):
        # Called computations (an async start's: the collective it wraps).
        each = [
          computation_ici(c)
          for key in ("to_apply", "calls", "branch_computations")
          + ("true_computation", "false_computation")
          for c in _attr(inst, key)
        ]
        if inst.op == "conditional" and each:
          hi_most = max(e[0] for e in each)
          each = [(hi_most, *(min(e[k] for e in each) for k in (1, 2, 3)))]
        hi += sum(e[0] for e in each)
        lo += sum(e[1] for e in each)
        unread += sum(e[2] for e in each)
        aside += sum(e[3] for e in each)
      else:
        operands = sum(shapes.get(o, 0.0) for o in inst.operands)
        op = inst.op
        if op == "all-reduce" and name.startswith("all-reduce-scatter"):
          op = "reduce-scatter"  # TPU's fusion: each keeps its slice
        sent = sent_bytes(op, operands, group_size(inst.attrs))
        hi, lo = hi + sent, lo + sent
        aside += sent if _under(inst, apart) else 0.0
    return hi, lo, unread, aside

  def host_side(name: str) -> bool | None:
    """Whether instruction `name`'s array lies in the host's memory (None:
    not one array, or not known)."""
    inst = named.get(name)
    arrays = _laid_out(inst.shape) if inst else []
    return arrays[0][1] if len(arrays) == 1 else None

  @functools.cache
  def computation_host(name: str) -> float:
    """Bytes `name` copies between device and host memory, each loop
    times its trips (a conditional: its costliest branch)."""
    total = 0.0
    for inst in comps.get(name, []):
      arrays = _laid_out(inst.shape)
      if inst.op == "while":
        body = (_attr(inst, "body") or [""])[0]
        total += computation_host(body) * (_trips(comps, inst, named) or 1)
      elif inst.op == "conditional":
        branches = _attr(inst, "branch_computations") or (
          _attr(inst, "true_computation") + _attr(inst, "false_computation")
        )
        total += max(map(computation_host, branches), default=0.0)
      elif inst.op in ("call", "async-start"):
        for key in ("to_apply", "calls"):
          total += sum(map(computation_host, _attr(inst, key)))
      elif inst.op in _HOST_COPIES and len(arrays) >= 2:
        moved, source = _HOST_COPIES[inst.op](arrays)
        total += moved[0] if moved[1] != source[1] else 0.0
      elif len(arrays) == 1 and inst.operands:
        size, here = arrays[0]
        if inst.op in ("copy", "dynamic-slice"):
          there = host_side(inst.operands[0])
        elif inst.op == "dynamic-update-slice" and len(inst.operands) > 1:
          there = host_side(inst.operands[1])  # the update moves
          size = shape_bytes(named[inst.operands[1]].shape)
        else:
          continue
        total += size if there is not None and there != here else 0.0
    return total

  flat = computation_bytes(entry, False)
  looped = computation_bytes(entry, True)
  ici, _, unread, aside = computation_ici(entry)
  return Estimate(
    flat,
    looped,
    tuple(loops),
    tuple(unknown),
    len(made),
    ici,
    unread,
    aside,
    computation_host(entry),
  )


def _laid_out(shape: str) -> list[tuple[float, bool]]:
  """(bytes, in the host's memory) of each array of an HLO shape."""
  return [
    (shape_bytes(f"{t}[{d}]"), _HOST_SPACE in layout)
    for t, d, layout in _LAID_OUT.findall(shape)
  ]


# An async copy's (moved array, the array on the side it leaves) among
# its shape's arrays: copy-start's (destination, source, context);
# dynamic-slice-start's ((source, indices...), slice, context);
# dynamic-update-slice-start's ((target, update, indices...), result,
# context), whose update is what moves.
_HOST_COPIES = {
  "copy-start": lambda a: (a[0], a[1]),
  "dynamic-slice-start": lambda a: (a[-2], a[0]),
  "dynamic-update-slice-start": lambda a: (a[1], a[0]),
}
