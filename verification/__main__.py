"""Run every check and print one table: ``python -m verification``.

    python -m verification                  # all checks
    python -m verification --only torch onnx

Exit status 1 when any row fails (a skipped row, such as the MPSGraph check off macOS, does not
fail). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from verification.common import progress, report

#: name → module, in the order they run
CHECKS = {
    "torch": "verification.check_torch",
    "onnx": "verification.check_onnx",
    "finite-differences": "verification.check_finite_differences",
    "mpsgraph": "verification.check_mpsgraph",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verification",
                                     description="Cross-check rnngrad's reference against "
                                                 "independent implementations.")
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), metavar="CHECK",
                        help=f"run only these checks ({', '.join(CHECKS)})")
    args = parser.parse_args(argv)
    rows = []
    for name, module in CHECKS.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        progress(f"{name} ...")
        rows += importlib.import_module(module).run()
        progress(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return report(rows)


if __name__ == "__main__":
    sys.exit(main())
