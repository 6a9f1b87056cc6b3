"""Names that survive a crash: what a server creates carries its tag, from which the next server
finds the PID of the one that made it; so it finds what a dead one left (cgroups, work folders,
containers) and sweeps it before serving.

The tag is not the PID itself (a sandbox sees some of these names, in its overlay's options):
as root, it is the PID sealed with a key of the host's (`KEY`, root's only, on /run: it lasts as
long as the host runs), a permutation of its 24 bits and a check, so only a server holding the
key reads it back, and a name sealed with another key (or a guessed one) is never taken for a
dead server's. Without root (no sandbox, the commands see the host anyway) the tag is the PID,
as every name was before, and a name sealed by root is not this server's to read.

Environments do not survive a restart: their processes are killed and their folders removed.
A PID that was reused by an unrelated live process keeps its leftovers until that process ends
(the sweep errs on the side of never touching a live server's things).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
from pathlib import Path

from managers.cpu.mounts import remove_folder

PREFIX = "tangram-"
KEY = Path("/run/tangram/name-key")  # the host's secret that seals a PID into a tag (root's)
SEALED = "x"  # a sealed tag's first letter: never a digit, so never read as a plain PID
_OWNED = re.compile(rf"tangram-(\d+|{SEALED}[0-9a-f]{{10}})-[0-9a-z]")
_BITS = 12  # each half of the 24-bit block a PID is sealed in (the kernel's PIDs are < 2**22)
_ROUNDS = 4


def owned_name(what: str, pid: int | None = None) -> str:
    """`tangram-<tag of this server (or of `pid`)>-<what>`."""
    return f"{PREFIX}{server_tag(os.getpid() if pid is None else pid)}-{what}"


def server_tag(pid: int) -> str:
    """The tag of the server `pid` in the names it makes: the PID sealed with the host's key,
    or the PID itself where there is no key to use (see the module docstring)."""
    key = _key()
    if key is None or not 0 < pid < 1 << 2 * _BITS:
        return str(pid)
    left, right = pid >> _BITS, pid & ((1 << _BITS) - 1)
    for r in range(_ROUNDS):  # a Feistel permutation of the 24 bits
        left, right = right, left ^ _round(key, r, right)
    block = left << _BITS | right
    return f"{SEALED}{block:06x}{_check(key, block)}"


def tag_owner(tag: str) -> int | None:
    """The PID a tag names (None where it is sealed with a key this server does not hold)."""
    if tag.isdigit():
        return int(tag)
    key = _key()
    block = int(tag[1:7], 16)
    if key is None or not tag.startswith(SEALED) or _check(key, block) != tag[7:]:
        return None
    left, right = block >> _BITS, block & ((1 << _BITS) - 1)
    for r in reversed(range(_ROUNDS)):
        left, right = right ^ _round(key, r, left), left
    return left << _BITS | right


def _round(key: bytes, r: int, half: int) -> int:
    digest = hashlib.blake2b(bytes([r]) + half.to_bytes(2, "big"), key=key, digest_size=2)
    return int.from_bytes(digest.digest(), "big") & ((1 << _BITS) - 1)


def _check(key: bytes, block: int) -> str:
    return hashlib.blake2b(b"check" + block.to_bytes(3, "big"), key=key, digest_size=2).hexdigest()


@functools.cache
def _key() -> bytes | None:
    """The host's key: read, or made once by the first root server since boot (written whole
    before it is linked into place, so a reader never sees part of it); None without root."""
    try:
        return KEY.read_bytes() or None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    if os.geteuid() != 0:
        return None
    try:
        KEY.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        draft = KEY.with_name(f".{KEY.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(draft, KEY)
        except FileExistsError:
            pass  # another server's came first: theirs it is
        finally:
            draft.unlink()
        return KEY.read_bytes()
    except OSError:
        return None


def dead_owner(name: str) -> int | None:
    """The PID of the server that named something `tangram-<tag>-...` when that server is gone;
    None when the name is not of that form, not sealed with this host's key, or its server
    still runs."""
    m = _OWNED.match(name)
    if m is None:
        return None
    pid = tag_owner(m.group(1))
    return pid if pid is not None and gone(pid) else None


def gone(pid: int) -> bool:
    """Whether no process has this PID (in this PID namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def sweep_workdirs(root: str | Path) -> list[str]:
    """Remove the work folders of dead servers under `root`, and unmount what they hold (a
    sandbox's view of its work folder: `mounts`); returns what was removed."""
    swept = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return swept
    for p in entries:
        pid = dead_owner(p.name)
        if pid is not None and p.is_dir() and not p.is_symlink():
            left = remove_folder(p)
            swept.append(f"{p} (server pid {pid})" + (f"; left: {'; '.join(left)}" if left else ""))
    return swept
