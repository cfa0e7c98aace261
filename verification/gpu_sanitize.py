"""One run for compute-sanitizer: every cell, forward and gradients, with every option on (an
LSTM also without its peephole, whose backward runs other v2 entry points), on backend
"metal-cuda"; or one planted defect kernel (``--defect NAME``).

    compute-sanitizer --tool memcheck python verification/gpu_sanitize.py
    compute-sanitizer --tool racecheck python verification/gpu_sanitize.py --defect race

Buffers are left uninitialised (``poison=False``) so that initcheck sees reads of memory no one
wrote. Prints one line, ``ok`` or what the run computed, and exits 0 unless the run raised.
"""

from __future__ import annotations

import argparse

import numpy as np

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"

#: name -> (MSL source, kernel, threads, buffers in bytes, threadgroup cap)
DEFECTS = {
    # a barrier missing after the read: a write-after-read race in threadgroup memory
    "race": (HEADER + """
kernel void race(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                 uint tpg [[threads_per_threadgroup]], uint gid [[thread_position_in_grid]]) {
    threadgroup float slot[1024];
    float v = float(lid);
    for (uint step = 0; step < 4; ++step) {
        slot[lid] = v;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        v = slot[min(lid + 32, tpg - 1)] + 1.0f;
    }
    out[gid] = v;
}""", "race", 256, [4 * 256], 256),
    # a barrier not reached by every thread of the threadgroup
    "divergent_barrier": (HEADER + """
kernel void early_exit(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]],
                       uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float t[1024];
    if (gid >= 1000) return;
    t[lid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[gid] = t[lid];
}""", "early_exit", 1024, [4 * 1000], 1024),
    # a write past the end of its buffer
    "out_of_bounds": (HEADER + """
kernel void unchecked(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    y[gid] = 2.0f;
}""", "unchecked", 128, [4 * 100], 1024),
    # a read of threadgroup memory no thread wrote (no barrier between write and read)
    "uninitialised_threadgroup": (HEADER + """
kernel void unsynced(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                     uint gid [[thread_position_in_grid]]) {
    threadgroup float t[1024];
    if (lid % 2 == 0) t[lid] = 1.0f;
    out[gid] = t[lid ^ 1];
}""", "unsynced", 1024, [4 * 1024], 1024),
    # assumes 1024 threads per threadgroup; run with 64
    "threadgroup_size": (HEADER + """
kernel void sum1024(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                    uint tg [[threadgroup_position_in_grid]]) {
    threadgroup float t[1024];
    t[lid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 512; s > 0; s >>= 1) {
        if (lid < s) t[lid] += t[lid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (lid == 0) out[tg] = t[0];
}""", "sum1024", 1024, [4 * 16], 64),
}


def run_defect(name: str) -> str:
    from rnngrad.backends.metal import cuda as metalcompute

    src, kernel, count, sizes, cap = DEFECTS[name]
    dev = metalcompute.Device(poison=False, max_threads_per_threadgroup=cap)
    bufs = [dev.buffer(n) for n in sizes]
    dev.finish([dev.kernel(src).function(kernel)(count, *bufs)])
    out = bufs[0].view("float32").get()
    return f"{name}: ran; first outputs {out[:4]}, NaN {int(np.isnan(out).sum())}"


def run_ops(H: int = 33) -> str:
    import rnngrad as rg
    from rnngrad.backends.metal.harness.contexts import cuda_device
    from rnngrad.testing import check_case
    from rnngrad.testing.cases import random_case

    rows = []
    with cuda_device(poison=False):
        for cell, desc in (("single_gate", rg.SingleGateRNNDescriptor(bidirectional=True, training=True)),
                           ("gru", rg.GRUDescriptor(reset_after=True, bidirectional=True, training=True)),
                           ("gru", rg.GRUDescriptor(reverse=True, training=True)),
                           ("lstm", rg.LSTMDescriptor(bidirectional=True, training=True)),
                           ("lstm", rg.LSTMDescriptor(training=True))):
            peephole = not (cell == "lstm" and not desc.bidirectional)  # both LSTM backwards
            case = random_case(5, cell, T=5, N=33, I=7, H=H, descriptor=desc, dtype=np.float32,
                               optional={k: k != "peephole" or peephole
                                         for k in ("input_weight", "bias", "init_state",
                                                   "init_cell", "mask", "peephole",
                                                   "secondary_bias", "state_gradient",
                                                   "cell_gradient")})
            for gradients in (False, True):
                worst, mismatches = check_case(case, "metal-cuda", gradients)
                rows.append(f"{cell} {'gradients' if gradients else 'forward'}: worst {worst:.3f}"
                            f"{' MISMATCH' if mismatches else ''}")
    return "; ".join(rows)


#: --flag: (the rnngrad.backends.metal.versions setting it sets, help)
SETTINGS = {
    "--v3-min-tiles": ("v3_min_tiles", "the fewest tiles v3 aims for (with "
                                       "RNNGRAD_METAL_RECURRENCE=v3): 1 gives the widest tiles"),
    "--wide-min-slice": ("wide_min_slice", "the fewest k of a v5 slice of K (with "
                                           "RNNGRAD_METAL_GEMM=v5): 8 splits the weight gradients "
                                           "of T·N = 165 rows into slices"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--defect", choices=sorted(DEFECTS))
    for flag, (attribute, help) in SETTINGS.items():
        parser.add_argument(flag, type=int, default=None, dest=attribute, help=help)
    parser.add_argument("--hidden", type=int, nargs="+", default=[33], metavar="H",
                        help="the cases' hidden sizes, each run in turn (33; a multiple of 4 takes "
                             "v2's float4 reads)")
    args = parser.parse_args(argv)
    from rnngrad.backends.metal import versions

    changes = {attribute: getattr(args, attribute) for attribute, _ in SETTINGS.values()
               if getattr(args, attribute) is not None}
    with versions.overrides(**changes):
        if args.defect:
            print(run_defect(args.defect), flush=True)
        for H in () if args.defect else args.hidden:
            print(f"H = {H}: {run_ops(H)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
