"""The `tangram` command line. Subcommands are resolved lazily so `tangram --help` stays fast
and no concrete solver, manager or experiment is imported before it is asked for."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

# subcommand -> ("module:function", help). Each function takes argv (list[str]) and returns an
# exit code; it owns its own argparse so its --help is complete.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tangram.demo:main", "a small real agentic-RL rollout, Tangram vs static allocation"),
    "serve": ("tangram.server:main", "serve the HTTP API (FastAPI)"),
    "replay": ("evaluation.replay:main", "simulate an instance file through an allocator"),
    "solve": ("solvers.exact.cli:main", "solve an instance file exactly (CP-SAT, PuLP)"),
    "gap": ("evaluation.gap:main", "heuristic vs exact optimality-gap study"),
    "experiment": ("evaluation.experiments:main", "run one of the paper's experiments"),
    "bench": ("tangram.bench:main", "benchmarks: dparrange, scheduler, exact, exec, gpu, runtime"),
}


def _resolve(target: str) -> Callable[[list[str]], int]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="tangram",
        description="ARL-Tangram: action-level resource management for agentic RL.",
        epilog="Run 'tangram COMMAND --help' for the options of one command.",
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND",
                        help="; ".join(f"{k}: {v[1]}" for k, v in COMMANDS.items()))
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    ns = parser.parse_args(argv[:1])
    from tangram.errors import TangramError

    try:
        return int(_resolve(COMMANDS[ns.command][0])(argv[1:]) or 0)
    except TangramError as exc:
        print(f"tangram {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (e.g. `| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
