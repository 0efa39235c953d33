"""verl plugin (entry point group ``verl.plugins``): ``import verl`` imports this module in every
process (driver, task runner, workers, agent-loop workers), which registers our extensions.

- always: the ``search_r1`` agent loop and the ``hf`` rollout (used only when a config names them);
- with ``VERL_PLATFORM=cpu`` only: the CPU platform and verl's FSDP engine for the cpu device.

verl swallows errors raised here (logged at DEBUG), so ``tests/test_plugin_on_cpu.py`` checks in
a fresh process that the registrations really happened.
"""

from train import agent_loop, cpu
from train.cpu import rollout as _hf_rollout

_hf_rollout.register()
REGISTERED = {"agent_loop": agent_loop.AGENT_NAME, "rollout": _hf_rollout.NAME}
if cpu.enabled():
    cpu.register()
    REGISTERED["platform"] = "cpu"
