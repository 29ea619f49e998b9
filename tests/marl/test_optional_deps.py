"""A missing pettingzoo / mpe2 / vmas is an ImportError naming the pip line that installs it.

Each case runs in a fresh process (``fresh_python``, tests/conftest.py) whose ``sys.meta_path``
starts with a finder that refuses the blocked top-level modules, so they are really absent there.
"""

from __future__ import annotations

import textwrap

import pytest

BLOCKER = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""


def _run(fresh_python, blocked: set[str], body: str) -> str:
    code = f"BLOCKED = {sorted(blocked)!r}\n{BLOCKER}\n{textwrap.dedent(body)}"
    out = fresh_python.run(code, absent=blocked, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


CHECK = """
import tdrl.marl  # importing the package needs none of them
from tdrl.marl.envs import {cls}
try:
    {call}
except ImportError as err:
    print(type(err).__name__, err)
else:
    print("no error")
"""


@pytest.mark.parametrize(("blocked", "cls", "call", "expect"), [
    ({"pettingzoo", "mpe2"}, "PettingZooEnv", 'PettingZooEnv("tictactoe_v3")',
     ["'pettingzoo', which is not installed", 'pip install "packages/marl[pettingzoo]"']),
    ({"pettingzoo", "mpe2"}, "PettingZooEnv", 'PettingZooEnv("simple_spread_v3")',
     ["'pettingzoo', which is not installed", 'pip install "packages/marl[pettingzoo]"']),
    ({"mpe2"}, "PettingZooEnv", 'PettingZooEnv("simple_spread_v3")',
     ["an MPE task", "'mpe2', which is not installed", 'pip install "packages/marl[pettingzoo]"']),
    ({"pettingzoo", "mpe2"}, "pettingzoo_tasks", "pettingzoo_tasks()", ['"packages/marl[pettingzoo]"']),
    ({"vmas"}, "VmasEnv", 'VmasEnv("navigation", num_envs=1)',
     ["VmasEnv needs 'vmas', which is not installed", 'pip install "packages/marl[vmas]"']),
])
def test_missing_dependency_names_the_install_line(fresh_python, blocked, cls, call, expect):
    out = _run(fresh_python, blocked, CHECK.format(cls=cls, call=call))
    assert out.startswith("ModuleNotFoundError"), out
    for text in expect:
        assert text in out, out


def test_without_mpe2_the_classic_games_still_work(fresh_python):
    out = _run(fresh_python, {"mpe2"}, """
        from tdrl.marl.envs import PettingZooEnv, pettingzoo_tasks
        env = PettingZooEnv("tictactoe_v3")
        print(env.group_map, "simple_spread_v3" in pettingzoo_tasks())
    """)
    assert out.strip() == "{'agents': ['player_1', 'player_2']} False"
