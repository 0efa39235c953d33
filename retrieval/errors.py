"""The errors a user sees, for every command of both packages: one line, no traceback, one exit status.

Library code raises a :class:`UserError` (or a subclass); a command's ``main`` is wrapped in
:func:`exit_on_error`, which prints ``error: <message>`` to stderr and returns the class's ``exit_code``.
The exit statuses mean the same in ``retrieval/`` and ``train/`` (``docs/errors.md``):

- 0: done;
- 1: an unexpected failure (a bug: Python prints its traceback);
- 2: bad input: a missing file, a bad flag value, data that fails its check, a preset or a machine that
  cannot run it, a download that fails (argparse's own errors exit 2 too);
- 3: the retriever failed or does not answer (``train``: the results written so far are kept, a rerun of
  the same command goes on);
- 4: an inference engine died (the results written so far are kept, a rerun goes on).

``train/errors.py`` extends these classes; this module imports nothing but the standard library, so
every module of both packages may import it.
"""

from __future__ import annotations

import functools
import sys

BAD_INPUT, RETRIEVER_FAILED, ENGINE_DIED = 2, 3, 4


class UserError(Exception):
    """A problem the user can fix, printed without a traceback (exit status ``exit_code``)."""

    exit_code = BAD_INPUT


class RetrieverFailed(UserError, RuntimeError):
    """The retriever failed or does not answer (exit 3)."""

    exit_code = RETRIEVER_FAILED


def message(e: BaseException) -> str:
    return str(e.args[0]) if e.args else type(e).__name__


def fail(e: UserError) -> int:
    """Print ``e`` as a command prints it; its exit status."""
    print(f"error: {message(e)}", file=sys.stderr)
    return e.exit_code


def exit_on_error(main):
    """Decorate a command's ``main``: a :class:`UserError` becomes ``error: ...`` on stderr and its exit
    status (returned, so ``sys.exit(main())`` exits with it and tests can call ``main`` directly)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            return fail(e)

    return wrapped
