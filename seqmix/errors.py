"""User-facing errors: one exception type whose message says what to do."""

from __future__ import annotations

import sys
from collections.abc import Callable


class SeqmixError(Exception):
    """A user-caused error (bad config, missing file, corrupt checkpoint, ...); its message says what to do."""


def command_status(action: Callable[[], object]) -> int:
    """Run a ``python -m seqmix.<command>``'s work: 0, or for a SeqmixError one ``seqmix: error:`` line and 2."""
    try:
        action()
    except SeqmixError as err:
        print(f"seqmix: error: {err}", file=sys.stderr)
        return 2
    return 0
