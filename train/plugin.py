"""verl plugin (entry point group ``verl.plugins``): ``import verl`` imports this module in every
process (driver, task runner, workers, agent-loop workers), which registers our extensions.

- always: the ``search_r1`` agent loop and the ``hf`` rollout (used only when a config names them), and
  the chunked log-prob kernel in place of verl's per-token loop (:mod:`train.workers.logprobs`);
- with ``VERL_PLATFORM=cpu`` only: the CPU platform and verl's FSDP engine for the cpu device;
- ``SEARCH_R1_PLUGINS``: a comma-separated list of modules (``pkg.mod``) or files (``path/to/x.py``)
  imported in every process too, e.g. to register a policy loss with verl's ``register_policy_loss``
  and select it with ``actor_rollout_ref.actor.policy_loss.loss_mode`` without packaging it.
  ``train.main`` imports them first in the driver (a bad name fails there, with its error) and
  forwards the variable to the Ray workers.

verl swallows errors raised here (logged at DEBUG), so ``tests/trainer/test_plugin_on_cpu.py`` checks in
a fresh process that the registrations really happened.
"""

import importlib
import importlib.util
import os
import sys

from train import PLUGINS_ENV, cpu
from train.cpu import hf_rollout as _hf_rollout
from train.search_r1 import agent_loop
from train.workers import logprobs


def import_user_plugins(spec: str | None = None) -> list[str]:
    """Import every module or ``.py`` file named in ``spec`` (default: ``$SEARCH_R1_PLUGINS``)."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    done = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        if name.endswith(".py"):
            path = os.path.abspath(name)
            mod_name = "search_r1_user_plugin_" + os.path.splitext(os.path.basename(path))[0]
            if mod_name not in sys.modules:
                if not os.path.isfile(path):
                    raise ImportError(f"{PLUGINS_ENV}: no such file: {path}")
                module_spec = importlib.util.spec_from_file_location(mod_name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[mod_name] = module
                module_spec.loader.exec_module(module)
        else:
            importlib.import_module(name)
        done.append(name)
    return done


_hf_rollout.register()
logprobs.install()
REGISTERED = {"agent_loop": agent_loop.AGENT_NAME, "rollout": _hf_rollout.NAME, "logprobs": "chunked"}
if cpu.enabled():
    cpu.register()
    REGISTERED["platform"] = "cpu"
REGISTERED["user_plugins"] = import_user_plugins()
