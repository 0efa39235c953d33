"""The errors a user sees in ``train/``: :mod:`retrieval.errors`'s model (one model for both packages,
``docs/errors.md``), with the kinds of problem ``train`` names.

Library code raises these; the commands (``train/*.py``, ``infer.py``) catch :class:`UserError` in
:func:`exit_on_error` and print ``error: <message>`` to stderr, exiting with the class's ``exit_code``:
2 bad input, 3 the retriever failed (results written so far are kept, a rerun of the same command goes
on), 4 an inference engine died (the same), 5 the collapse warning stopped a training run.

No verl, torch or Flask import here: every module may import it.
"""

from __future__ import annotations

from typing import Optional

from retrieval.errors import ENGINE_DIED, RetrieverFailed, UserError, exit_on_error, fail, message  # noqa: F401


class DataError(UserError, ValueError):
    """A data file fails its check (the message names the file and line)."""


class ConfigError(UserError, ValueError):
    """A preset or override that cannot run (the message names the setting)."""


class SetupError(UserError, RuntimeError):
    """The machine cannot run this: a GPU driver or torch build that does not match, no compiler, ..."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint folder that cannot be resumed or read."""


class InferenceError(UserError, RuntimeError):
    """A model path that cannot be loaded, a retriever that cannot be reached, ..."""


class RetrieverDown(RetrieverFailed):
    """Too many searches failed; ``results`` holds the results kept so far (written to the results file)."""

    def __init__(self, text: str, results: Optional[list] = None):
        super().__init__(text)
        self.results: list = list(results or [])


class EngineDead(UserError, RuntimeError):
    """The engine can answer no more questions (vLLM's EngineCore died: an out-of-memory, a GPU fault)."""

    exit_code = ENGINE_DIED


#: ``python -m train.main``'s exit status when the collapse warning ended the run (``collapse_warning.action``
#: stop, or rollback with no rollback left)
COLLAPSE_STOPPED = 5


class CollapseStopped(UserError, RuntimeError):
    """The collapse warning raised its alarm and ``collapse_warning.action`` is ``stop`` (or ``rollback``
    with ``max_rollbacks`` used up): the step was saved, the run ended (the message names the signals
    and the checkpoint)."""

    exit_code = COLLAPSE_STOPPED
