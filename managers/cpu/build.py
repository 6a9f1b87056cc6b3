"""Building an image without a container registry: a list of steps, each cached by its inputs.

Steps (JSON objects, applied in order to a copy of the previous step's tree):

    {"debian": {"suite": "bookworm", "packages": ["python3"], "mirror": URL}}
        a Debian root filesystem made by mmdebstrap (or debootstrap), from Debian's own
        packages; only as the first step
    {"host": {"programs": ["sh", "python3.11"], "folders": ["/usr/lib/python3.11"]}}
        host programs and folders copied at their own paths with the shared libraries they
        (and every .so under the folders) link, found with ldd: a small image from the host's
        own files, for a machine with no Debian mirror
    {"pip": ["pytest==9.2.0"]}
        `pip install --target` into the image's site-packages (run by the server's Python,
        so the image's Python must be the same minor version)
    {"copy": {"from": HOST_PATH, "to": IMAGE_PATH}}
        a host file or folder copied into the image
    {"file": {"path": IMAGE_PATH, "content": TEXT, "mode": 420}}

The cache key of a step is the sha256 of the previous step's digest and the step's JSON (for
`copy`: its destination and the digest of what is copied, wherever it lies), so a step reruns
only when it or a step before it changed. Each step's tree is stored in the image store like
any image (unnamed, by digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from managers.cpu.grant import SAFE_PATH
from managers.cpu.images import Image, ImageStore, tree_digest
from tangram.errors import TangramError, ValidationError

MINIMAL_ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


def build(
    store: ImageStore,
    name: str,
    steps: Sequence[Mapping[str, Any]],
    log: Callable[[str], None] = lambda _: None,
) -> Image:
    """Apply `steps` (see the module docstring), reusing every cached step; name the result."""
    if isinstance(steps, str | bytes) or not isinstance(steps, Sequence) or not steps:
        raise ValidationError("steps", steps, "must be a non-empty list of build steps")
    cache = _cache(store)
    digest = ""
    for i, step in enumerate(steps):
        kind = _kind(step, i)
        named = step if kind != "copy" else {"copy": {"to": step[kind].get("to")}}
        key = hashlib.sha256(
            (
                digest
                + json.dumps(named, sort_keys=True)  # a copy: by content
                + _input_digest(kind, step[kind])
            ).encode()
        ).hexdigest()
        cached = cache.get(key)
        if cached is not None and _stored(store, cached):
            log(f"step {i + 1}/{len(steps)} {kind}: cached ({cached[:19]})")
            digest = cached
            continue
        log(f"step {i + 1}/{len(steps)} {kind}: running")
        staging = store.staging()
        tree = staging / "rootfs"
        try:
            if digest:
                subprocess.run(
                    [
                        "cp",
                        "-a",
                        "--reflink=auto",
                        "--",
                        f"{store.resolve(digest).rootfs}/.",
                        str(tree),
                    ],
                    check=True,
                )
            elif kind not in ("debian", "host"):
                _minimal(tree)
            STEPS[kind](tree, step[kind])
            image = store.commit_tree(None, staging, f"build:{kind}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        digest = image.digest
        cache[key] = digest
        _save_cache(store, cache)
    store.tag(name, digest)
    return store.resolve(name)


def _kind(step: Any, i: int) -> str:
    if not isinstance(step, Mapping) or len(step) != 1 or next(iter(step)) not in STEPS:
        raise ValidationError(
            f"steps[{i}]", step, f"must be one of {sorted(STEPS)} with its arguments"
        )
    kind = next(iter(step))
    if kind == "debian" and i != 0:
        raise ValidationError(f"steps[{i}]", step, "a debian step can only come first")
    return kind


def _input_digest(kind: str, arg: Any) -> str:
    if kind == "copy" and isinstance(arg, Mapping) and os.path.isdir(str(arg.get("from"))):
        return tree_digest(Path(arg["from"]))[0]
    if kind == "copy" and isinstance(arg, Mapping) and os.path.isfile(str(arg.get("from"))):
        return hashlib.sha256(Path(arg["from"]).read_bytes()).hexdigest()
    return ""


def _stored(store: ImageStore, digest: str) -> bool:
    try:
        store.resolve(digest)
    except ValidationError:
        return False
    return True


def _cache(store: ImageStore) -> dict[str, str]:
    try:
        return dict(json.loads((store.root / "build-cache.json").read_text()))
    except (OSError, ValueError):
        return {}


def _save_cache(store: ImageStore, cache: dict[str, str]) -> None:
    tmp = store.root / f".build-cache.{os.getpid()}"
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, store.root / "build-cache.json")


def _minimal(tree: Path) -> None:
    for rel, text in MINIMAL_ETC.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    for d in ("tmp", "sandbox"):
        (tree / d).mkdir(exist_ok=True)
    (tree / "tmp").chmod(0o1777)


def _inside(tree: Path, path: str, field: str) -> Path:
    p = Path(os.path.normpath("/" + str(path).lstrip("/"))).relative_to("/")
    if not str(p) or str(p) == ".":
        raise ValidationError(field, path, "must name a path below /")
    return tree / p


# -- the steps ---------------------------------------------------------------------------------
def _debian(tree: Path, arg: Mapping[str, Any]) -> None:
    suite = str(arg.get("suite", "bookworm"))
    packages = [str(p) for p in arg.get("packages", [])]
    tool = shutil.which("mmdebstrap")
    if tool:
        argv = [
            tool,
            "--variant=minbase",
            "--mode=root",
            "--skip=check/empty",
            *(["--include=" + ",".join(packages)] if packages else []),
            suite,
            str(tree),
        ]
    elif shutil.which("debootstrap"):
        argv = [
            "debootstrap",
            "--variant=minbase",
            *(["--include=" + ",".join(packages)] if packages else []),
            suite,
            str(tree),
        ]
    else:
        raise TangramError(
            "a debian step needs mmdebstrap or debootstrap (Debian: `apt-get install mmdebstrap`)"
        )
    if arg.get("mirror"):
        argv.append(str(arg["mirror"]))
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise TangramError(f"{' '.join(argv)} failed: {done.stderr.strip()[-800:]}")


def _libraries(paths: Sequence[str]) -> set[str]:
    libs: set[str] = set()
    for p in paths:
        out = subprocess.run(["ldd", p], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(/\S+\.so[.\d]*)", out))
    return libs


def _copy_at(tree: Path, host: str) -> None:
    """Copy a host path to the same path in the tree: every folder on the way made, a link on
    the way (merged /usr: /lib -> usr/lib) kept as a link and its target copied too."""
    parts = Path(host).parts[1:]
    for i in range(1, len(parts) + 1):
        here = Path("/", *parts[:i])
        mine = tree.joinpath(*parts[:i])
        if here.is_symlink():
            if not mine.is_symlink() and not mine.exists():
                mine.symlink_to(os.readlink(here))
            target = os.path.normpath(os.path.join(here.parent, os.readlink(here)))
            _copy_at(tree, os.path.join(target, *parts[i:]))
            return
        if i < len(parts):
            if not mine.exists():
                mine.mkdir()
                shutil.copystat(here, mine)
        elif not mine.exists():
            subprocess.run(["cp", "-a", "--", str(here), str(mine)], check=True)


def _host(tree: Path, arg: Mapping[str, Any]) -> None:
    programs = [str(p) for p in arg.get("programs", [])]
    folders = [str(f) for f in arg.get("folders", [])]
    found = []
    for prog in programs:
        path = shutil.which(prog, path=SAFE_PATH)  # the system's, not a virtual environment's
        if path is None:
            raise ValidationError("host.programs", prog, "not found on the host")
        found.append(path)
    for f in folders:
        if not os.path.isabs(f) or not os.path.exists(f):
            raise ValidationError("host.folders", f, "must be an existing absolute host path")
    elves = [*found]
    for f in folders:
        for dirpath, _, names in os.walk(f):
            elves += [os.path.join(dirpath, n) for n in names if ".so" in n]
    for p in [*found, *folders, *sorted(_libraries(elves))]:
        _copy_at(tree, p)
    for link in ("bin", "lib", "lib64", "sbin"):  # a merged-/usr host's top-level links
        host = Path("/") / link
        if host.is_symlink() and not (tree / link).exists():
            (tree / link).symlink_to(os.readlink(host))
    _minimal(tree)


def _pip(tree: Path, arg: Any) -> None:
    reqs = [str(r) for r in (arg if isinstance(arg, list) else [])]
    if not reqs:
        raise ValidationError("pip", arg, "must be a non-empty list of requirements")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = tree / f"usr/local/lib/python{version}/dist-packages"
    target.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-warn-script-location",
        "--disable-pip-version-check",
        "--target",
        str(target),
        *reqs,
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise TangramError(f"pip install {' '.join(reqs)} failed: {done.stderr.strip()[-800:]}")


def _copy(tree: Path, arg: Mapping[str, Any]) -> None:
    src = str(arg.get("from", ""))
    if not os.path.exists(src):
        raise ValidationError("copy.from", src, "no such host file or folder")
    dest = _inside(tree, str(arg.get("to", "")), "copy.to")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if os.path.isdir(src):
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", "--", f"{src}/.", str(dest)], check=True)
    else:
        shutil.copy2(src, dest)


def _file(tree: Path, arg: Mapping[str, Any]) -> None:
    dest = _inside(tree, str(arg.get("path", "")), "file.path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(str(arg.get("content", "")))
    dest.chmod(int(arg.get("mode", 0o644)))


STEPS: dict[str, Callable[[Path, Any], None]] = {
    "debian": _debian,
    "host": _host,
    "pip": _pip,
    "copy": _copy,
    "file": _file,
}
