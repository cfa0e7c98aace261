"""A JIT adapter over many problems: check_module's time, resident memory and memory maps
every hundred problems, to show that compiled programs are reused and memory stays flat.

    python -m verification.adapter_soak flax gru --problems 1000
    KERAS_BACKEND=jax python -m verification.adapter_soak keras lstm --problems 1000
    python -m verification.adapter_soak equinox lstm --problems 1000

Prints one line every ``--every`` problems: problems checked, seconds, CPU seconds, RSS (MiB)
and /proc/self/maps lines; then the compiled configurations and programs kept.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m verification.adapter_soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=("flax", "equinox", "keras"))
    parser.add_argument("cell", choices=("rnn", "gru", "lstm"))
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)

    from rnngrad.testing import check_module
    from rnngrad.testing.adapters import _jax

    if args.framework == "flax":
        from rnngrad.testing.adapters.flax import flax_adapter as make
    elif args.framework == "equinox":
        from rnngrad.testing.adapters.equinox import equinox_adapter as make
    else:
        from rnngrad.testing.adapters.keras import keras_adapter as make
    start, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime - cpu0.ru_utime + r.ru_stime - cpu0.ru_stime

    print("problems  seconds  cpu_s  rss_mib  maps", flush=True)

    def progress(n):
        if n % args.every == 0:
            print(f"{n:8d}  {time.perf_counter() - start:7.1f}  {cpu():5.1f}  {rss_mib():7.1f}  "
                  f"{_jax.memory_maps():5d}", flush=True)

    report = check_module(make(args.cell), args.cell, max_examples=args.problems, seed=args.seed,
                          dtype=args.dtype, scenarios_first=False, progress=progress)
    print(report)
    programs = sum(f[0]._cache_size() + f[1]._cache_size() for f in _jax._COMPILED.values())
    print(f"configurations compiled: {len(_jax._COMPILED)}, programs kept: {programs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
