"""One error hierarchy for the whole project, rooted at `TangramError`."""

from __future__ import annotations

import errno
import resource


class TangramError(Exception):
    """Base of every error Tangram raises on purpose."""


class ValidationError(TangramError, ValueError):
    """A value a user gave is not acceptable; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}: {problem} (got {value!r})")

    def __reduce__(self):  # pickled whole (it crosses into a helper process and back)
        return (type(self), (self.field, self.value, self.problem))


class NotFound(ValidationError):
    """A request names an environment, service or API that does not exist (HTTP 404)."""


class Infeasible(TangramError):
    """No allocation can satisfy the request."""


class InvariantError(TangramError, AssertionError):
    """An allocation broke an invariant (over capacity, a core or GPU used twice, ...)."""


class BackendUnavailable(TangramError):
    """A requested backend cannot run on this machine; the message names the fix."""


class ActionFailed(TangramError):
    """An action could not run (its environment is lost or broken, its node died, ...)."""


class NodeLost(ActionFailed):
    """The node an action was to run on is gone (its machine or its agent died): the call could
    not run, which is not the action's or the service's error (its result is `failed`)."""


class ShuttingDown(TangramError):
    """The runtime is closing and admits no new work (HTTP 503)."""


class QueueFull(TangramError):
    """The scheduler's queue holds its documented maximum: the caller should retry later
    (HTTP 429)."""


class LimitReached(TangramError):
    """A limit of the host (open files, processes) keeps the server from taking this request
    now; the message names the limit and its value (HTTP 503)."""


def out_of_files(exc: BaseException) -> LimitReached | None:
    """`LimitReached` naming the open-file limit when `exc` is EMFILE or ENFILE, else None."""
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return LimitReached(
            f"the server is out of file descriptors (RLIMIT_NOFILE {soft}); "
            f"close environments or raise the limit"
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENFILE:
        return LimitReached("the host is out of file descriptors (fs.file-max)")
    return None
