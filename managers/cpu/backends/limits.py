"""Host limits met by a backend, as errors that name them (`LimitReached`, HTTP 503)."""

from __future__ import annotations

from tangram.errors import out_of_files


def raise_if_out_of_files(exc: OSError) -> None:
    """`LimitReached` naming the open-file limit when `exc` is EMFILE or ENFILE."""
    limit = out_of_files(exc)
    if limit is not None:
        raise limit from exc
