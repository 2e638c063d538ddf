"""plan/program.py's reading of a compiled program's HLO."""

import jax
import jax.numpy as jnp

from rlreason.plan import program


def test_largest_buffers_skip_values_inside_fused_computations():
  """A [1, D] x [D, V] product XLA strength-reduces to a fused multiply +
  reduce names an f32[D, V] inside the fusion, which is never stored (a
  7B sampler's listing showed it as its largest buffer, 2 GiB); the
  listing keeps the stored bf16[D, V] weights and the [V] result."""
  d, v = 64, 1024
  f = jax.jit(lambda x, w: (x[:, None] * w.astype(jnp.float32)).sum(0))
  x = jax.ShapeDtypeStruct((d,), jnp.float32)
  w = jax.ShapeDtypeStruct((d, v), jnp.bfloat16)
  text = f.lower(x, w).compile().as_text()
  every = {s for _, s, _ in program.largest_buffers(text + "\n", k=100)}
  assert "f32[64,1024]" in text  # the fused computation's value exists
  assert "f32[64,1024]" not in every, every
  assert {"bf16[64,1024]", "f32[1024]"} <= every, every


def test_largest_buffers_name_arrays_in_host_memory():
  """An array in the host's memory space (layout S(5): a layer input
  offloaded under --remat_policy=offload, as libtpu lays it out) is
  listed as "(host)", apart from a device array of the same shape."""
  text = (
    "ENTRY %main () -> f32[16,2,512,128] {\n"
    "  %a = f32[16,2,512,128]{3,2,1,0:T(8,128)S(5)} custom-call(), "
    'custom_call_target="AllocateBuffer"\n'
    "  ROOT %b = f32[16,2,512,128]{3,2,1,0:T(8,128)} copy(%a)\n"
    "}\n"
  )
  got = program.largest_buffers(text)
  assert got == [
    (16 * 2 * 512 * 128 * 4, "f32[16,2,512,128] (host)", "custom-call"),
    (16 * 2 * 512 * 128 * 4, "f32[16,2,512,128]", "copy"),
  ], got


def test_largest_buffers_name_a_tuples_arrays_where_they_are_made():
  """A tuple (one element or more) and a token are not arrays of their
  own: the listing names each array once, by the op that made it."""
  text = (
    "ENTRY %main (p: f32[8]) -> (f32[8]) {\n"
    "  %p = f32[8]{0} parameter(0)\n"
    "  %t = token[] after-all()\n"
    "  %n = f32[8]{0} negate(%p)\n"
    "  ROOT %r = (f32[8]{0}) tuple(%n)\n"
    "}\n"
  )
  assert program.largest_buffers(text) == [(32, "f32[8]", "negate,parameter")]
