"""User-facing errors: one exception type whose message says what to do."""

from __future__ import annotations


class SeqmixError(Exception):
    """A user-caused error (bad config, missing file, corrupt checkpoint, ...); its message says what to do."""
