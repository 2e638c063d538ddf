"""The package's layers: every module imports, each imports only its own layer
or the layers below it, and no two modules import each other (even through
others, or inside a function)."""

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "rlreason"

# Bottom to top (rlreason/__init__.py). Modules directly under rlreason/
# (mesh, devices, types, config, storage, metrics, testing) are layer 0, except
# testing, which builds test fixtures from every layer.
LAYERS = (
  "model",
  "sampling",
  "rl",
  "data",
  "rewards",
  "guidance",
  "envs",
  "train",
  "eval",
  "plan",
)
TOP_LEVEL_ABOVE_ALL = ("rlreason.testing",)


def module_names() -> list[str]:
  out = []
  for p in sorted(ROOT.rglob("*.py")):
    parts = p.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out.append(".".join(parts))
  return out


def layer(module: str) -> int:
  if module in TOP_LEVEL_ABOVE_ALL:
    return len(LAYERS) + 1
  parts = module.split(".")
  if len(parts) >= 2 and parts[1] in LAYERS:
    return LAYERS.index(parts[1]) + 1
  return 0


def imports_of(module: str, known: set[str]) -> set[str]:
  """rlreason modules `module` imports, anywhere in its file."""
  rel = module.replace(".", "/")
  path = ROOT.parent / (rel + ".py")
  if not path.exists():
    path = ROOT.parent / rel / "__init__.py"
  deps = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      if not node.module.startswith("rlreason"):
        continue
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        deps.add(full if full in known else node.module)
    elif isinstance(node, ast.Import):
      deps.update(a.name for a in node.names if a.name.startswith("rlreason"))
  deps.discard(module)
  return deps


def graph() -> dict[str, set[str]]:
  names = module_names()
  known = set(names)
  return {m: imports_of(m, known) for m in names}


def test_every_module_imports():
  for name in module_names():
    importlib.import_module(name)


def test_layer_names_are_the_packages():
  packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
  assert packages == set(LAYERS)


def test_a_layer_imports_only_layers_below_it():
  bad = [
    f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
    for m, deps in graph().items()
    for d in sorted(deps)
    if layer(d) > layer(m)
  ]
  assert not bad, "\n".join(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}  # 1 = on the stack, 2 = done
  stack: list[str] = []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for d in sorted(g.get(m, ())):
      if state.get(d) == 1:
        return stack[stack.index(d) :] + [d]
      if d not in state and (found := visit(d)):
        return found
    stack.pop()
    state[m] = 2
    return None

  for m in sorted(g):
    if m not in state and (found := visit(m)):
      return found
  return None


def test_no_import_cycle():
  g = graph()
  # A package's __init__ re-exporting its modules is not a cycle of theirs.
  for m in g:
    g[m] = {d for d in g[m] if not m.startswith(d + ".")}
  cycle = find_cycle(g)
  assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize(
  "g, expected",
  [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
  ],
)
def test_find_cycle(g, expected):
  assert find_cycle(g) == expected


def test_layer_of_a_module():
  assert layer("rlreason.mesh") == 0
  assert layer("rlreason.model.transformer") == 1
  assert layer("rlreason.eval.trained") == LAYERS.index("eval") + 1
  assert layer("rlreason.plan.aot") == len(LAYERS)
  assert layer("rlreason.data.tasks.base") == LAYERS.index("data") + 1
