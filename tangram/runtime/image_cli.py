"""`tangram image`: the node's image store (the one `tangram serve` uses on this machine).

    tangram image import NAME SOURCE     a root-filesystem folder, a tarball (`docker export`),
                                         an OCI image layout folder or an Apptainer/Singularity
                                         .sif file (its squashfs root, read by unsquashfs)
    tangram image ls [--json]
    tangram image rm NAME|DIGEST         refused while an environment or snapshot uses it
    tangram image build NAME [--debian SUITE] [--packages P,...] [--host PROG ...]
                        [--host-folder DIR ...] [--pip REQ ...] [--copy SRC:DEST ...]
                        [--steps FILE.json]
                                         from Debian's packages (mmdebstrap/debootstrap) or the
                                         host's own programs, then pip packages and files; each
                                         step cached (see managers.cpu.build)

`--state-dir` (default $TANGRAM_STATE_DIR, else /var/lib/tangram as root) must be the server's.
"""

from __future__ import annotations

import argparse
import json
import sys

from managers.cpu.build import build
from managers.cpu.images import ImageStore
from managers.cpu.node import default_state_dir
from tangram.errors import TangramError, ValidationError


def _steps(ns: argparse.Namespace) -> list[dict]:
    steps: list[dict] = json.loads(open(ns.steps).read()) if ns.steps else []
    if ns.debian:
        steps.insert(
            0,
            {
                "debian": {
                    "suite": ns.debian,
                    "packages": [p for p in (ns.packages or "").split(",") if p],
                }
            },
        )
    if ns.host or ns.host_folder:
        steps.insert(
            1 if ns.debian else 0,
            {"host": {"programs": ns.host or [], "folders": ns.host_folder or []}},
        )
    if ns.pip:
        steps.append({"pip": ns.pip})
    for spec in ns.copy or []:
        src, sep, dest = spec.rpartition(":")
        if not sep or not src or not dest.startswith("/"):
            raise ValidationError("--copy", spec, "must be HOST_PATH:/PATH/IN/IMAGE")
        steps.append({"copy": {"from": src, "to": dest}})
    return steps


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tangram image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state-dir", default=None, help="the node's state folder")
    sub = p.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import", help="import a folder, tarball, OCI layout or .sif file")
    imp.add_argument("name")
    imp.add_argument("source")
    ls = sub.add_parser("ls", help="list the images")
    ls.add_argument("--json", action="store_true")
    rm = sub.add_parser("rm", help="remove a name (the tree goes with its last name)")
    rm.add_argument("ref")
    b = sub.add_parser("build", help="build an image step by step (cached)")
    b.add_argument("name")
    b.add_argument("--debian", metavar="SUITE", help="start from Debian SUITE (mmdebstrap)")
    b.add_argument("--packages", help="Debian packages, comma-separated")
    b.add_argument("--host", nargs="+", metavar="PROG", help="host programs (and libraries)")
    b.add_argument("--host-folder", nargs="+", metavar="DIR", help="host folders")
    b.add_argument("--pip", nargs="+", metavar="REQ", help="pip requirements")
    b.add_argument("--copy", nargs="+", metavar="SRC:DEST", help="host paths into the image")
    b.add_argument("--steps", metavar="FILE", help="a JSON list of steps (run first)")
    ns = p.parse_args(argv)
    store = ImageStore(f"{ns.state_dir or default_state_dir()}/images")
    if ns.cmd == "import":
        image = store.import_(ns.name, ns.source)
        print(f"{ns.name} {image.digest} ({image.bytes >> 20} MiB)")
        for kind, n in image.dropped:  # never stored on the host: said, not silent
            what = "setuid/setgid bits" if kind == "setuid" else "device nodes"
            print(f"  dropped {what} of {n} entries (see meta.json of the image)")
    elif ns.cmd == "ls":
        images = store.ls()
        if ns.json:
            print(json.dumps([i.to_dict() for i in images]))
        else:
            print(f"images in {store.root} (the node's store: every server of this machine)")
            print(f"{'DIGEST':<19}  {'SIZE':>10}  NAMES")
            for i in images:  # an unnamed one is a build step's cache
                names = ", ".join(i.names) or "(a build step's cache, unnamed)"
                print(f"{i.digest[:19]}  {i.bytes >> 20:>6} MiB  {names}")
            if not images:
                print("(none)")
    elif ns.cmd == "rm":
        print("removed " + ", ".join(store.rm(ns.ref)))
    else:
        steps = _steps(ns)
        image = build(store, ns.name, steps, log=lambda line: print(line, file=sys.stderr))
        print(f"{ns.name} {image.digest} ({image.bytes >> 20} MiB)")
    return 0


def run(argv: list[str]) -> int:
    """`main` with `tangram`'s error handling (for `python -m tangram.runtime.image_cli`, which
    works from a source checkout whose entry points are not installed)."""
    try:
        return main(argv)
    except TangramError as exc:
        print(f"tangram image: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
