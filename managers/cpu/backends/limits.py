"""Host limits met by a backend, as errors that name them (`LimitReached`, HTTP 503)."""

from __future__ import annotations

import errno
import resource

from tangram.errors import LimitReached


def raise_if_out_of_files(exc: OSError) -> None:
    """`LimitReached` naming the open-file limit when `exc` is EMFILE or ENFILE."""
    if exc.errno == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise LimitReached(f"the server is out of file descriptors (RLIMIT_NOFILE {soft}); "
                           f"close environments or raise the limit") from exc
    if exc.errno == errno.ENFILE:
        raise LimitReached("the host is out of file descriptors (fs.file-max)") from exc
