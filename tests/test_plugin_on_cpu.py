"""verl loads our plugin through the `verl.plugins` entry point (it swallows load errors, so check)."""

import subprocess
import sys


def fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


def test_import_verl_loads_plugin_in_fresh_process():
    r = fresh("import sys, verl\n"
              "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
              "assert 'train.plugin' in sys.modules, 'plugin module not loaded by import verl'\n"
              "assert _agent_loop_registry['search_r1']['_target_'] == 'train.agent_loop.SearchR1AgentLoop'\n"
              "import train.plugin; assert train.plugin.REGISTERED == {'agent_loop': 'search_r1', 'rollout': 'hf'}\n"
              "print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_entry_point_declared_and_packages_import():
    r = fresh("from importlib.metadata import entry_points\n"
              "eps = {e.name: e.value for e in entry_points(group='verl.plugins')}\n"
              "assert eps.get('search_r1_llds') == 'train.plugin', eps\n"
              "import train, retrieval, verl; print(verl.__version__)")
    assert r.returncode == 0 and r.stdout.strip() == "0.9.1", r.stderr[-3000:]


def test_plugins_can_be_disabled():
    r = fresh("import os; os.environ['VERL_USE_EXTERNAL_PLUGINS'] = 'none'\n"
              "import sys, verl; print('train.plugin' in sys.modules)")
    assert r.stdout.strip() == "False", r.stderr[-3000:]
