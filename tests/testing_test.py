"""rlreason/testing.py's helpers, checked directly (the others run inside
the tests that use them)."""

from rlreason import testing


def test_xla_flags_keep_the_tests_settings_and_set_the_device_count(
  monkeypatch,
):
  monkeypatch.setenv(
    "XLA_FLAGS",
    "--xla_a=1 --xla_force_host_platform_device_count=8 --xla_b=false",
  )
  assert testing.xla_flags() == "--xla_a=1 --xla_b=false"
  assert testing.xla_flags(2, "--xla_c=3") == (
    "--xla_a=1 --xla_b=false --xla_force_host_platform_device_count=2 --xla_c=3"
  )
  monkeypatch.delenv("XLA_FLAGS")
  assert testing.xla_flags(4) == "--xla_force_host_platform_device_count=4"
