"""Sandbox (one test per hostile snippet), tool and search environments."""

import os
import time
import uuid

import pytest

from rlreason.data import tasks
from rlreason.data.sources import Example
from rlreason.envs import base
from rlreason.envs import calc
from rlreason.envs import sandbox
from rlreason.envs import registry
from rlreason.envs import search


def test_sandbox_runs_code():
  res = sandbox.run_python("print(6 * 7)")
  assert (res.status, res.stdout) == ("ok", "42\n")


def test_sandbox_writes_inside_its_temp_dir():
  res = sandbox.run_python(
    "open('f.txt', 'w').write('x'); print(open('f.txt').read())"
  )
  assert (res.status, res.stdout) == ("ok", "x\n")


def test_sandbox_denies_network():
  res = sandbox.run_python(
    "import socket\n"
    "s = socket.create_connection(('127.0.0.1', 80), timeout=1)\n"
    "print('connected')"
  )
  assert res.status == "denied" and "connected" not in res.stdout


def test_sandbox_denies_raw_socket():
  res = sandbox.run_python("import socket; socket.socket(); print('made')")
  assert res.status == "denied" and "made" not in res.stdout


def test_sandbox_denies_writes_outside_temp_dir(tmp_path):
  target = tmp_path / f"escape_{uuid.uuid4().hex}"
  res = sandbox.run_python(f"open({str(target)!r}, 'w').write('x')")
  assert res.status == "denied"
  assert not os.path.exists(target)


def test_sandbox_denies_deleting_outside_temp_dir(tmp_path):
  target = tmp_path / "keep.txt"
  target.write_text("keep")
  res = sandbox.run_python(f"import os; os.remove({str(target)!r})")
  assert res.status == "denied" and target.exists()


def test_sandbox_denies_subprocesses():
  res = sandbox.run_python("import os; os.system('touch /tmp/rr_pwned')")
  assert res.status == "denied"


def test_sandbox_stops_runaway_time():
  t0 = time.monotonic()  # time.time() can jump (NTP)
  res = sandbox.run_python("while True: pass", timeout_s=1.0)
  assert res.status == "timeout"
  # The loop never ends by itself; margin for a loaded 2-core CI machine
  # (starting the sandboxed interpreter there alone can take seconds).
  assert time.monotonic() - t0 < 1.0 + 8.0


def test_sandbox_stops_runaway_memory():
  res = sandbox.run_python(
    "x = bytearray(2**31); print('allocated')", memory_mb=128
  )
  assert res.status == "memory" and "allocated" not in res.stdout


def test_parse_action_both_spellings():
  assert base.parse_action("search: Ava Tor\n", ("search",)) == (
    "search",
    "Ava Tor",
  )
  assert base.parse_action("<search>x y</search>", ("search",)) == (
    "search",
    "x y",
  )
  assert base.parse_action("I think", ("search", "answer")) is None


def test_stop_strings_of_the_envs():
  # The line format's newline and each tool's end tags; any env without the
  # attribute ends turns at a newline.
  assert base.stop_strings(registry.make("search")) == (
    "\n",
    "</search>",
    "</answer>",
  )
  assert base.stop_strings(registry.make("calculator"))[1] == "</calculator>"
  tags_only = registry.make("search", stop_strings=("</search>", "</answer>"))
  assert base.stop_strings(tags_only) == ("</search>", "</answer>")
  assert base.stop_strings(object()) == base.DEFAULT_STOP_STRINGS == ("\n",)
  # A tag action parsed after its turn was ended by the tag.
  env = registry.make("search", stop_strings=("</search>",))
  env.reset(Example("u", "Q: Where does Ava Tor live?\n", "x"))
  r = env.step("<search>Ava Tor lives</search>")
  assert r.observation.startswith("\nresult: Ava Tor lives in ")


def test_calculator_env_episode():
  calc.register_task()
  p = tasks.get("calc").generate(0, 1)
  env = registry.make("calculator")
  env.reset(Example("u", p.prompt, p.answer))
  expr = calc.gold_call(p.prompt)[1]["expression"]
  r = env.step(f"calculator: {expr}\n")
  assert not r.done and r.observation == f"output: {p.answer}\n"
  r = env.step(f"answer: {p.answer}\n")
  assert r.done and r.reward == 1.0


@pytest.mark.parametrize("difficulty", [1, 2])
def test_every_kbqa_question_is_answerable_from_the_corpus(difficulty):
  # Following the reference solution's queries through the index recovers
  # exactly the facts of the solution, hence the answer.
  search.register_task()
  task = tasks.get("kbqa")
  for p in task.problems("train", 100, difficulty):
    env = search.SearchEnv()
    env.reset(Example(p.uid, p.prompt, p.answer))
    lines = p.solution.splitlines()
    for query, result in zip(lines[0::2], lines[1::2]):
      if not query.startswith("search: "):
        break
      assert env.step(query + "\n").observation == result + "\n"
    assert env.step(lines[-1] + "\n").reward == 1.0


def test_index_is_deterministic():
  a = search.Index(search.world(0).docs).search("Rome is in", 3)
  assert a == search.index(0).search("in is Rome", 3)
