"""The guard's logs (`tangram.runtime.guard`): the token shown as `***` (`RedactTokens`) and
repeated messages rate-limited (`RateLimitedLog`, and the guard's own notes: `flood`)."""

from __future__ import annotations

import collections
import logging
import re
import time
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

log = logging.getLogger("tangram.runtime.guard")

LOG_EVERY_S = 10.0  # one line per message kind per this many seconds, then a count


_PAIR = re.compile(r"([?&;])([^=&\s\"]*)=([^&\s\"]*)")


class RedactTokens(logging.Filter):
    """Shows the token as `***` in every argument of a log record: any query parameter whose
    decoded name is `token`, and the token itself wherever it appears, plain or URL-encoded."""

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.forms = sorted(
            {f for f in (token, token and quote(token, safe=""), token and quote_plus(token)) if f},
            key=len,
            reverse=True,
        )

    def redact(self, text: str) -> str:
        text = _PAIR.sub(
            lambda m: (
                f"{m[1]}{m[2]}=***" if unquote_plus(m[2]).strip().lower() == "token" else m[0]
            ),
            text,
        )
        for form in self.forms:
            text = text.replace(form, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        return True


def redact_tokens(logger: logging.Logger, token: str | None = None) -> None:
    """Install `RedactTokens` on `logger` (replacing an earlier one, which may know another
    token)."""
    for f in [f for f in logger.filters if isinstance(f, RedactTokens)]:
        logger.removeFilter(f)
    logger.addFilter(RedactTokens(token))


class _Flood:
    """Counts repeated events and logs each kind at most once per `LOG_EVERY_S`."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.quiet: collections.Counter[str] = collections.Counter()

    def note(self, kind: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, -LOG_EVERY_S) < LOG_EVERY_S:
            self.quiet[kind] += 1
            return
        more = self.quiet.pop(kind, 0)
        self.last[kind] = now
        log.warning(
            msg + (f" (and {more} more like it in the last {LOG_EVERY_S:g} s)" if more else ""),
            *args,
        )


flood = _Flood()


class RateLimitedLog(logging.Filter):
    """Lets one record per message template through per `LOG_EVERY_S` (the next one says how
    many were dropped): a flood of accept errors or invalid requests writes a few lines."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, float] = {}
        self.dropped: collections.Counter[str] = collections.Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        first = str(record.msg).split("\n", 1)[0]
        key = f"{record.name}:{_NUMBERS.sub('#', first)}"  # addresses, times, fds vary
        now = time.monotonic()
        if now - self.last.get(key, -LOG_EVERY_S) < LOG_EVERY_S:
            self.dropped[key] += 1
            return False
        self.last[key] = now
        more = self.dropped.pop(key, 0)
        if more:
            record.msg = f"{record.msg} (and {more} more like it in the last {LOG_EVERY_S:g} s)"
        return True


FLOOD_LOGGERS = ("asyncio", "uvicorn.error")
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")


def quiet_floods() -> None:
    """Rate-limit the loggers that a flood of bad connections writes to (once)."""
    for name in FLOOD_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in logger.filters):
            logger.addFilter(RateLimitedLog())
