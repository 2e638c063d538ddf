"""The environment registry: names -> factories (one instance per rollout row).

    env = registry.make("search", seed=0)
    registry.register("my_env", MyEnv)

Kept apart from envs/base.py so that base (the protocol and the tool env)
imports no environment built on it.
"""

from typing import Callable

from rlreason.envs import base
from rlreason.envs import search


_REGISTRY: dict[str, Callable[..., base.Env]] = {
  "python": lambda **kw: base.ToolEnv(tool="python", **kw),
  "calculator": lambda **kw: base.ToolEnv(tool="calculator", **kw),
  "search": lambda **kw: search.SearchEnv(**kw),
}


def register(name: str, factory: Callable[..., base.Env]) -> None:
  if name in _REGISTRY:
    raise ValueError(f"env {name!r} is already registered")
  _REGISTRY[name] = factory


def names() -> list[str]:
  return sorted(_REGISTRY)


def make(name: str, **kwargs) -> base.Env:
  """A new environment instance (one per rollout row)."""
  try:
    factory = _REGISTRY[name]
  except KeyError:
    raise KeyError(f"unknown env {name!r}; known: {names()}") from None
  return factory(**kwargs)
