"""Notices: a setting that has no effect here, a choice made for the user; never an error.

``notice(message)`` logs ``message`` at WARNING level to the logger ``tileinfer`` (``LOGGER``).
A library does not print: a Python API user sees notices on stderr through logging's last-resort
handler until they configure logging, and silences them with
``logging.getLogger("tileinfer").setLevel(logging.ERROR)``. The command line prints each one as a
``notice: ...`` line on stderr, after the engine was built (so that an error is the first line),
and ``--quiet`` silences them.
"""

from __future__ import annotations

import logging

LOGGER = logging.getLogger("tileinfer")


def notice(message: str) -> None:
    """Tell the user ``message`` (one line, without a ``notice:`` prefix) through logging."""
    LOGGER.warning(message)


__all__ = ["LOGGER", "notice"]
