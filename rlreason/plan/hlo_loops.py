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

from rlreason.plan import hlo_text

# Instructions that move no bytes of their own (or whose called
# computations are counted instead).
_FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
  "after-all", "partition-id", "replica-id", "opt-barrier",
  "add-dependency", "while", "call", "conditional",
}  # fmt: skip
_SLICES = {"slice", "dynamic-slice"}


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


def _op_name(inst: hlo_text.Instruction) -> str:
  m = re.search(r'op_name="([^"]*)"', inst.attrs)
  return m.group(1) if m else ""


def _own(loop: hlo_text.Instruction) -> bool:
  """A loop the program wrote (lax.scan, fori_loop, while_loop lower to
  an op_name ending in "while"), not one XLA's partitioner made."""
  name = _op_name(loop)
  return not name or name.rsplit("/", 1)[-1] == "while"


def _under(inst: hlo_text.Instruction, scope: str) -> bool:
  """Whether inst's op_name has `scope` as a path component."""
  return bool(scope) and scope in _op_name(inst).split("/")


def estimate(text: str, apart: str = "") -> Estimate:
  comps, entry = hlo_text.parse(text)
  named = {i.name: i for insts in comps.values() for i in insts}
  loops, unknown, made = [], [], set()

  def fusion_bytes(inst, shapes) -> float:
    """Operands as read inside the fused computation, and its result
    (an in-place dynamic-update-slice writes only its update)."""
    called = (hlo_text.attr(inst, "calls") or [""])[0]
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
    out = hlo_text.shape_bytes(inst.shape)
    if root is not None and root.op == "dynamic-update-slice":
      target = root.operands[0] if root.operands else ""
      if target in params and len(root.operands) > 1:
        in_place.add(params[target])
        update = by_name.get(root.operands[1])
        out = hlo_text.shape_bytes(update.shape) if update else out
    total = out
    for name, index in params.items():
      if index in in_place or index >= len(inst.operands):
        continue
      uses = users.get(name, [])
      if uses and all(u.op in _SLICES and u.operands[0] == name for u in uses):
        total += sum(hlo_text.shape_bytes(u.shape) for u in uses)
      else:
        total += shapes.get(inst.operands[index], 0.0)
    return total

  @functools.cache
  def computation_bytes(name: str, looped: bool) -> float:
    shapes = {}
    total = 0.0
    for inst in comps.get(name, []):
      shapes[inst.name] = hlo_text.shape_bytes(inst.shape)
      if inst.op == "while":
        body = (hlo_text.attr(inst, "body") or [""])[0]
        cond = (hlo_text.attr(inst, "condition") or [""])[0]
        own = _own(inst)
        n = hlo_text.trips(comps, inst, named) if own else 1
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
          computation_bytes(c, looped) for c in hlo_text.attr(inst, "to_apply")
        )
      elif inst.op == "conditional":
        branches = hlo_text.branches(inst)
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
      shapes[inst.name] = hlo_text.shape_bytes(inst.shape)
      if inst.op == "while":
        body = (hlo_text.attr(inst, "body") or [""])[0]
        b_hi, b_lo, b_unread, b_aside = computation_ici(body)
        n = hlo_text.trips(comps, inst, named)
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
          for c in hlo_text.attr(inst, key)
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
    arrays = hlo_text.laid_out(inst.shape) if inst else []
    return arrays[0][1] if len(arrays) == 1 else None

  @functools.cache
  def computation_host(name: str) -> float:
    """Bytes `name` copies between device and host memory, each loop
    times its trips (a conditional: its costliest branch)."""
    total = 0.0
    for inst in comps.get(name, []):
      arrays = hlo_text.laid_out(inst.shape)
      if inst.op == "while":
        body = (hlo_text.attr(inst, "body") or [""])[0]
        total += computation_host(body) * (
          hlo_text.trips(comps, inst, named) or 1
        )
      elif inst.op == "conditional":
        branches = hlo_text.branches(inst)
        total += max(map(computation_host, branches), default=0.0)
      elif inst.op in ("call", "async-start"):
        for key in ("to_apply", "calls"):
          total += sum(map(computation_host, hlo_text.attr(inst, key)))
      elif inst.op in _HOST_COPIES and len(arrays) >= 2:
        moved, source = _HOST_COPIES[inst.op](arrays)
        total += moved[0] if moved[1] != source[1] else 0.0
      elif len(arrays) == 1 and inst.operands:
        size, here = arrays[0]
        if inst.op in ("copy", "dynamic-slice"):
          there = host_side(inst.operands[0])
        elif inst.op == "dynamic-update-slice" and len(inst.operands) > 1:
          there = host_side(inst.operands[1])  # the update moves
          size = hlo_text.shape_bytes(named[inst.operands[1]].shape)
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
