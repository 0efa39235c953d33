"""verl loads our plugin through the `verl.plugins` entry point (it swallows load errors, so check)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fresh(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, **(env or {})})


def test_import_verl_loads_plugin_in_fresh_process():
    r = fresh("import sys, verl\n"
              "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
              "assert 'train.plugin' in sys.modules, 'plugin module not loaded by import verl'\n"
              "assert _agent_loop_registry['search_r1']['_target_'] == 'train.search_r1.agent_loop.SearchR1AgentLoop'\n"
              "import train.plugin\n"
              "assert train.plugin.REGISTERED == {'agent_loop': 'search_r1', 'rollout': 'hf', 'logprobs': 'chunked', "
              "'user_plugins': []}\n"
              "import verl.workers.engine.fsdp.transformer_impl as engine, verl.utils.torch_functional as F\n"
              "assert engine.logprobs_from_logits is F.logprobs_from_logits and F.logprobs_from_logits._search_r1\n"
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


def test_user_plugins_are_imported_in_every_process_that_imports_verl():
    """SEARCH_R1_PLUGINS (a file here; module names work too) registers a policy loss with verl's
    registry as soon as verl is imported, as in every Ray worker."""
    r = fresh("import verl\n"
              "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
              "import train.plugin\n"
              "assert {'sabotage_flipped', 'sabotage_zero', 'sabotage_unlikely'} <= set(POLICY_LOSS_REGISTRY), "
              "sorted(POLICY_LOSS_REGISTRY)\n"
              "print(train.plugin.REGISTERED['user_plugins'])",
              env={"SEARCH_R1_PLUGINS": f"json, {ROOT / 'tests' / 'sabotage.py'}"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(["json", str(ROOT / "tests" / "sabotage.py")])


def test_a_bad_user_plugin_fails_before_ray_starts_naming_it(tmp_path):
    env = {**os.environ, "SEARCH_R1_PLUGINS": "no_such_module_xyz"}
    r = subprocess.run([sys.executable, "-m", "train.main", "--config-name", "cpu_smoke"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "SEARCH_R1_PLUGINS='no_such_module_xyz'" in r.stderr and "No module named" in r.stderr, r.stderr[-2000:]
    assert "ray" not in r.stderr.lower().split("error:")[-1]


def test_import_user_plugins_errors(tmp_path):
    from train.plugin import import_user_plugins

    with pytest.raises(ImportError, match="no such file"):
        import_user_plugins(str(tmp_path / "missing.py"))
    assert import_user_plugins(" , ") == []
