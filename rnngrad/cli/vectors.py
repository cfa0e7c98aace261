"""``rnngrad export-vectors DIR``: write golden test vectors for implementations outside Python.

Writes ``DIR/manifest.json`` and one ``.npz`` per case (see :mod:`rnngrad.testing.vectors` for the
names, layouts and tolerances). ``--suite core`` is small enough to vendor into another
repository; ``--suite full`` adds boundary sizes, saturating values and NaN/Inf rows.
"""

from __future__ import annotations

import os
import sys

HELP = "write golden test vectors (manifest.json and one .npz per case) into a directory"


def add_arguments(parser):
    parser.add_argument("directory", metavar="DIR", help="where to write (created if needed)")
    parser.add_argument("--suite", choices=("core", "full"), default="core",
                        help="core: regression set and every descriptor option (default); "
                             "full: also boundary sizes, saturating values, NaN/Inf")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random values (default 0)")
    parser.add_argument("--dtype", choices=("float32", "float16", "float64"), default="float32",
                        help="dtype of the stored inputs (default float32); expected results are float64")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def run(args) -> int:
    from ..testing.vectors import export_vectors

    if os.path.isdir(args.directory) and os.listdir(args.directory) and not args.force:
        print(f"export-vectors: DIR: expected an empty or new directory, got {args.directory!r} "
              f"with {len(os.listdir(args.directory))} entries (use --force to write into it)",
              file=sys.stderr)
        return 2

    def progress(i, total, name):
        if i == total or i % 10 == 0:
            print(f"[{i:>3}/{total}] {name}", file=sys.stderr)

    manifest = export_vectors(args.directory, args.suite, seed=args.seed, dtype=args.dtype,
                              progress=progress)
    total = sum(c["bytes"] for c in manifest["cases"])
    classes = sorted({c["class"] for c in manifest["cases"]})
    print(f"wrote {len(manifest['cases'])} cases ({total / 1024:.0f} KiB) and manifest.json to "
          f"{args.directory} (suite {args.suite}, seed {args.seed}, {args.dtype})")
    print(f"classes: {', '.join(classes)}")
    print("check a candidate: rnngrad.testing.check_vectors(candidate, DIR)")
    return 0
