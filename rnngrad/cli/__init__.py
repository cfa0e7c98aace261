"""The ``rnngrad`` command line (also ``python -m rnngrad``).

Each subcommand lives in its own module of this package, which defines ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> exit status``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_COMMANDS = {
    "info": "rnngrad.cli.info",
    "verify": "rnngrad.cli.verify",
    "bench": "rnngrad.cli.bench",
    "export-vectors": "rnngrad.cli.vectors",
}


def _modules():
    found = {}
    for name, path in _COMMANDS.items():
        try:
            found[name] = importlib.import_module(path)
        except ModuleNotFoundError as exc:
            if exc.name != path:  # the command exists but something it needs does not
                raise
    return found


def main(argv=None) -> int:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="rnngrad",
        description="Forward passes and BPTT gradients of MPSGraph's recurrent ops, exactly.",
    )
    parser.add_argument("--version", action="version", version=f"rnngrad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = _modules()
    for name, module in modules.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
