"""The `tangram` command line. Its subcommands are plugins (`tangram.registry.Registry`): the
runtime's own are built-ins named below (found from a source checkout too), the evaluation's
and third parties' are entry points of the group `tangram.commands` (see pyproject.toml). Each
names a function that takes argv (list[str]) and returns an exit code, owning its own argparse
so its --help is complete. Only the chosen command's module is imported, so `tangram --help`
stays fast and the runtime never imports the evaluation layer above it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from tangram.errors import TangramError
from tangram.registry import Registry

GROUP = "tangram.commands"

COMMANDS: Registry[Callable[[list[str]], int]] = Registry(
    "command",
    {
        "serve": "tangram.runtime.server:main",
        "image": "tangram.runtime.image_cli:main",
        "top": "tangram.runtime.top:main",
    },
    group=GROUP,
)


def commands() -> list[str]:
    """Every subcommand's name."""
    return COMMANDS.names()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = commands()
    parser = argparse.ArgumentParser(
        prog="tangram",
        description="ARL-Tangram: action-level resource management for agentic RL.",
        epilog="Run 'tangram COMMAND --help' for the options of one command.",
    )
    parser.add_argument(
        "command",
        choices=sorted(found),
        metavar="COMMAND",
        help="one of: " + ", ".join(sorted(found)),
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        if set(found) <= set(COMMANDS.builtin_names()):
            print(
                "\nthe evaluation's commands (demo, bench, ...) are entry points: "
                "pip install -e . registers them",
                file=sys.stderr,
            )
        return 0
    ns = parser.parse_args(argv[:1])
    try:
        command = COMMANDS.get(ns.command)
        assert command is not None  # argparse checked the choice
        return int(command(argv[1:]) or 0)
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
