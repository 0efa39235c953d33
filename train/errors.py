"""The errors a user sees: one line, no traceback, a documented exit status.

Library code raises these; the commands (``train/*.py``, ``infer.py``) catch :class:`UserError` in
:func:`exit_on_error` and print ``error: <message>`` to stderr, exiting with the class's ``exit_code``:

- 2: bad input (a missing file, a bad flag value, data that fails its check, a preset that cannot run,
  a machine that cannot run it);
- 3: the retriever failed: results written so far are kept, a rerun of the same command goes on;
- 4: an inference engine died: results written so far are kept, a rerun goes on.

No verl, torch or Flask import here: every module may import it.
"""

from __future__ import annotations

import functools
import sys


class UserError(Exception):
    """A problem the user can fix, printed without a traceback (exit status ``exit_code``)."""

    exit_code = 2


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


class RetrieverDown(UserError, RuntimeError):
    """Too many searches failed; ``args[1]`` (when given) holds the results kept so far."""

    exit_code = 3


class EngineDead(UserError, RuntimeError):
    """The engine can answer no more questions (vLLM's EngineCore died: an out-of-memory, a GPU fault)."""

    exit_code = 4


def message(e: BaseException) -> str:
    return str(e.args[0]) if e.args else type(e).__name__


def exit_on_error(main):
    """Decorate a command's ``main``: a :class:`UserError` becomes ``error: ...`` on stderr and its exit
    status (returned, so ``sys.exit(main())`` exits with it and tests can call ``main`` directly)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            print(f"error: {message(e)}", file=sys.stderr)
            return e.exit_code

    return wrapped
