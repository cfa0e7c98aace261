"""``rnngrad info``: the version, the backends available here and why the others are not."""

import platform
import sys

HELP = "show the version, the backends available on this machine and why others are not"


def add_arguments(parser):
    parser.add_argument("--measure-gemm", action="store_true",
                        help="measure the GEMM libraries' rates again (one thread, the "
                             "recurrences' shapes) and keep the new choice for the numba backend")


def run(args) -> int:
    import numpy as np

    from .. import __version__, registry

    print(f"rnngrad {__version__}  (Python {platform.python_version()}, NumPy {np.__version__}, "
          f"{platform.system()} {platform.machine()})")
    print()
    rows = registry.status()
    width = max(len(name) for name, *_ in rows)
    print("backends (in the order backend=None tries them):")
    for name, ok, automatic, reason in rows:
        mark = "available" if ok else "unavailable"
        note = "" if automatic else "  [only when asked for by name]"
        print(f"  {name:<{width}}  {mark}{note}")
        where = registry.get(name).device() if ok else ""
        if where:
            print(f"  {'':<{width}}    on: {where}")
        if not ok:
            print(f"  {'':<{width}}    why: {reason}")
    try:
        from ..machine import blas_report
    except ImportError:
        blas_report = None
    if blas_report is not None:
        print()
        print("BLAS and CPU:")
        try:
            from ..backends.numba import blas as numba_blas
        except ImportError:  # numba is not installed
            numba_blas = None
        if numba_blas is not None:
            from ..backends import numba as numba_backend

            choice = numba_blas.remeasure() if args.measure_gemm else None
            print("  numba backend GEMMs" + (" (measured again: new processes use this)"
                                             if choice else "") + ":")
            print("\n".join(f"    {line}" for line in numba_blas.library(choice).splitlines()))
            from ..backends.numba import warmup

            print(f"  numba kernel cache: {numba_backend.cache_location()}")
            if warmup.folder() is not None:  # rnngrad's folder, not NUMBA_CACHE_DIR or numba's own
                left, tasks = warmup.missing(), len(warmup.CELLS) * len(warmup.DTYPES)
                line = (f"  numba kernels compiled ahead: {tasks - len(left)} of {tasks} "
                        "cell × dtype tasks")
                if left:
                    line += (" (left to compile on first use, or by `rnngrad verify`: "
                             + ", ".join(f"{cell} {dtype}" for cell, dtype in left) + ")")
                print(line)
        for line in blas_report():
            print(f"  {line}")
    sys.stdout.flush()
    return 0
