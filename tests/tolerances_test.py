"""Every approximate comparison in the tests names both of its tolerances.

assert_allclose's default atol is 0 (and np.allclose's 1e-8): a value near
zero then fails on a difference of one rounding step, so the machine, the
thread count or the XLA version decides whether the suite passes (issue 21).
This test parses every test module (and rlreason/testing.py) and fails on
a comparison that leaves either tolerance to its default, naming the file
and line.
"""

import ast
import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "tests").rglob("*.py")) + [
  ROOT / "rlreason" / "testing.py"
]

# Function name -> the keywords it must be given: (relative, absolute).
REQUIRED = {
  "assert_allclose": ("rtol", "atol"),
  "assert_trees_all_close": ("rtol", "atol"),
  "allclose": ("rtol", "atol"),
  "isclose": ("rtol", "atol"),
  "approx": ("rel", "abs"),
}
MATH_ISCLOSE = ("rel_tol", "abs_tol")
# Comparisons that cannot name both tolerances: use assert_allclose.
BANNED = {
  "assertAlmostEqual",
  "assertNotAlmostEqual",
  "assert_almost_equal",
  "assert_array_almost_equal",
}


def _name(node: ast.AST) -> str | None:
  if isinstance(node, ast.Attribute):
    return node.attr
  if isinstance(node, ast.Name):
    return node.id
  return None


def _required(func: ast.AST) -> tuple[str, str]:
  value = func.value if isinstance(func, ast.Attribute) else None
  if isinstance(value, ast.Name) and value.id == "math":
    return MATH_ISCLOSE
  return REQUIRED[_name(func)]


def _check_keywords(call: ast.Call, func: ast.AST, where: str) -> list[str]:
  if any(k.arg is None for k in call.keywords):
    return [f"{where}: {_name(func)} takes **kwargs; name the tolerances"]
  have = {k.arg for k in call.keywords}
  missing = [k for k in _required(func) if k not in have]
  if missing:
    names = " and ".join(f"{k}=" for k in missing)
    return [f"{where}: {_name(func)} without {names}"]
  return []


def violations(source: str, filename: str) -> list[str]:
  """'file:line: message' for each comparison that lacks a tolerance."""
  tree = ast.parse(source, filename)
  out = []
  checked = set()  # ids of the references already checked as calls
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    where = f"{filename}:{node.lineno}"
    name = _name(node.func)
    if name in BANNED:
      out.append(f"{where}: {name}; use assert_allclose(rtol=, atol=)")
    elif name in REQUIRED:
      out += _check_keywords(node, node.func, where)
      checked.add(id(node.func))
    elif name == "partial" and node.args and _name(node.args[0]) in REQUIRED:
      out += _check_keywords(node, node.args[0], where)
      checked.add(id(node.args[0]))
  for node in ast.walk(tree):
    # A bare reference (jax.tree.map(np.testing.assert_allclose, a, b))
    # compares with the default tolerances.
    if (
      isinstance(node, (ast.Attribute, ast.Name))
      and isinstance(node.ctx, ast.Load)
      and _name(node) in REQUIRED
      and id(node) not in checked
    ):
      out.append(
        f"{filename}:{node.lineno}: {_name(node)} passed on without "
        "tolerances; wrap it in functools.partial(..., rtol=, atol=)"
      )
  return sorted(out, key=lambda v: int(v.split(":")[1]))


def test_every_comparison_names_both_tolerances():
  found = []
  for path in SOURCES:
    found += violations(path.read_text(), str(path.relative_to(ROOT)))
  assert not found, "\n".join(found)


BAD = {
  "np.testing.assert_allclose(a, b)": "without rtol= and atol=",
  "np.testing.assert_allclose(a, b, rtol=1e-5)": "without atol=",
  "np.testing.assert_allclose(a, b, atol=1e-6, err_msg='x')": "without rtol=",
  "chex.assert_trees_all_close(a, b, atol=1e-6)": "without rtol=",
  "assert np.allclose(a, b)": "allclose without",
  "assert not jnp.allclose(a, b, rtol=1e-5)": "allclose without atol=",
  "assert np.isclose(a, b, atol=1e-6).all()": "isclose without rtol=",
  "assert math.isclose(a, b, rel_tol=1e-9)": "isclose without abs_tol=",
  "assert x == pytest.approx(0.3)": "approx without rel= and abs=",
  "assert x == pytest.approx(0.3, abs=1e-6)": "approx without rel=",
  "assert x == approx(0.3, rel=1e-6)": "approx without abs=",
  "np.testing.assert_allclose(a, b, **tol)": "takes **kwargs",
  "f = partial(np.testing.assert_allclose, atol=1e-5)": "without rtol=",
  "jax.tree.map(np.testing.assert_allclose, a, b)": "passed on without",
  "self.assertAlmostEqual(x, 0.0, places=6)": "assertAlmostEqual; use",
}
GOOD = """
np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(a, b, atol=1e-6, err_msg="m", rtol=0)
chex.assert_trees_all_close(a, b, rtol=1e-5, atol=1e-6)
assert not np.allclose(a, b, rtol=0, atol=1e-3)
assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
assert x == pytest.approx(0.3, rel=1e-6, abs=1e-9)
jax.tree.map(
  functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), a, b
)
jax.tree.map(
  lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=0), x, y
)
np.testing.assert_array_equal(tokens, want)
metrics["approx_kl"]
"""


def test_the_check_catches_each_missing_tolerance():
  for line, message in BAD.items():
    source = textwrap.dedent(f"""
      x = 1
      {line}
    """)
    (found,) = violations(source, "synthetic.py")
    assert found.startswith("synthetic.py:3: "), (line, found)
    assert message in found, (line, found)
  assert violations(GOOD, "synthetic.py") == []
