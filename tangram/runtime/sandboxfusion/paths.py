"""The file paths and contents of SandboxFusion's requests (`files`, `fetch_files`), checked the
same way for `/run_code` and `/run_jupyter`: a path inside the sandbox, content in base64."""

from __future__ import annotations

import base64
import binascii
import posixpath


def sandbox_path(path: str) -> str:
    """A path inside the sandbox, normalised: relative to its work directory, or absolute (in
    the sandbox's own view: its private /tmp, its work directory; see `absolute_allowed`);
    ValueError when a relative one escapes the work directory or it cannot be a file name."""
    if not path or "\x00" in path or "\\" in path:
        raise ValueError(f"{path!r} is not a file path")
    norm = posixpath.normpath(path)
    if path.startswith("/"):
        if norm in ("/", "//"):
            raise ValueError(f"{path!r} is not a file path")
        return norm
    if norm in (".", "") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{path!r} escapes the sandbox's work directory")
    return norm


def check_files(files: dict[str, str | None]) -> dict[str, str | None]:
    """`files` ({path: base64 content or None}) unchanged, or ValueError naming the first path
    that is not one or whose content is not base64."""
    for path, content in files.items():
        sandbox_path(path)
        if content is not None:
            try:
                base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"{path!r}: content is not base64 ({exc})") from None
    return files


def check_fetch(paths: list[str]) -> list[str]:
    """`fetch_files` unchanged, or ValueError naming the first that is not a path."""
    for path in paths:
        sandbox_path(path)
    return paths
