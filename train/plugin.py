"""verl plugin (entry point group ``verl.plugins``): ``import verl`` imports this module in every
process (driver, task runner, workers, agent-loop workers), which registers our agent loop.

verl swallows errors raised here (logged at DEBUG), so ``tests/test_plugin_on_cpu.py`` checks in
a fresh process that the registration really happened.
"""

from train import agent_loop  # noqa: F401  (registers "search_r1")

REGISTERED = {"agent_loop": agent_loop.AGENT_NAME}
