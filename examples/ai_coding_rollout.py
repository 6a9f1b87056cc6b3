"""AI coding, end to end: a task image holding a real project (six, with its own test suite and
a planted bug), one environment from it, a GRPO group of 8 forked from that environment, a
different patch in each sample, and the project's tests as the elastic reward through the
scheduler. Needs root and bubblewrap (the bwrap backend), and PyPI (or pip's cache) for the
project's sdist and pytest. The steps are in `evaluation.coding_rollout`.

    python examples/ai_coding_rollout.py [--group 8] [--state-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json

from evaluation.coding_rollout import render, run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--group", type=int, default=8, help="samples in the group (at most 8)")
    p.add_argument(
        "--state-dir",
        help="the node's image store and layers (default: the "
        "server's, $TANGRAM_STATE_DIR or /var/lib/tangram)",
    )
    p.add_argument("--json", action="store_true")
    ns = p.parse_args()
    out = run(ns.group, ns.state_dir, log=lambda line: None if ns.json else print(line))
    print(json.dumps(out) if ns.json else render(out))
    fixes = [s for s in out["samples"] if s["patch"].startswith("fix")]
    return 0 if fixes and all(s["reward"] == 1.0 for s in fixes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
