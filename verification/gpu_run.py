"""Everything the GPU machine is needed for, in one call, with a short table last.

    python verification/gpu_run.py [--out DIR] [--quick] [--skip STEP ...] [--sanitize CONFIG ...]
                                   [--no-defects] [--deadline SECONDS]
                                   [--also layer compile host step mps] [--baseline TREE ...]

1. the environment (GPU, CUDA, CuPy, PyTorch);
2. the GPU property tests: ``python -m pytest -m gpu``;
3. ``rnngrad verify --backend metal-cuda`` (and with fast math, to show which rows survive it);
4. compute-sanitizer memcheck, racecheck, synccheck and initcheck over one run of every cell
   (``verification/gpu_sanitize.py``) under each version setting of ``--sanitize``, then over each
   planted defect kernel;
5. the bench: metal-cuda beside PyTorch's cuDNN ``nn.RNN``/``nn.GRU``/``nn.LSTM``, forward +
   backward, float32, TF32 off, at the four default shapes: kernel time (rnngrad: CUDA events
   around its dispatches, and the device's own time of each dispatch from torch.profiler, the
   method of cuDNN's column: its kernels' device time), every version setting of the bench
   timed both ways, and end-to-end time of one call with the inputs already on the GPU (also
   without the harness's NaN fill of new buffers) against cuDNN's wall, the two taken in
   alternating windows, each the median of seven (``paired_walls``); dispatches per op; time per
   step; a profile of the host's own time where it dominates (LSTM 50×1×64×64);
6. only when asked (``--also layer compile host step mps``): ``bench_layer.py --device cuda``
   (``rnngrad.torch``'s layer beside its bare ops and cuDNN's layer), the same with both under
   ``torch.compile(mode="reduce-overhead")``, ``gpu_host.py --shapes 50x1x64x64`` (an op's host
   time by phase; first in each ``--baseline`` copy of the project, for a before and after),
   ``gpu_step_profile.py`` (an eager training step under torch.profiler: the CUDA calls inside
   it that wait for the device; its trace in ``logs.tar.gz``), and the ``metal-mps`` stand-in
   on CUDA (``rnngrad verify --backend metal-mps`` and ``bench_mps.py --standin cuda``).

DIR (default ``$OUT`` or ``gpu-results``) receives few files: ``run.txt`` (what was printed),
``logs.tar.gz`` (each step's full output), ``bench.json``, ``rnngrad-bench.json`` and
``host-profile.txt``. A step that fails does not stop the others; the exit status is 1 if any
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((100, 32, 256, 256), (50, 1, 64, 64), (200, 64, 512, 512), (1000, 8, 128, 128))
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
#: each tool's options: racecheck reports every hazard (its default analysis mode summarises)
TOOL_OPTIONS = {"racecheck": ("--racecheck-report", "hazard")}


def _env(extra=None, root=ROOT):
    """The environment of a step: ``root``'s project first on the path, before what the path
    held (packages installed to a folder of their own stay importable)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    env.setdefault("NUMBA_CACHE_DIR", "/tmp/rnngrad-numba")  # no numba warm-up on this machine
    return env


#: time.time() by which every step must have ended (``--deadline``); None: no limit
DEADLINE = None
#: name: (RNNGRAD_METAL_GEMM, RNNGRAD_METAL_RECURRENCE, extra arguments of gpu_sanitize.py, what
#: they do): the versions the rules pick, each GEMM version past v1 everywhere, v1's recurrences,
#: every v2 entry point, v3's tiles at their narrowest and widest
SANITIZER_CONFIGS = {
    "auto": ("auto", "auto", (), ""),
    "gemm-v3": ("v3", "auto", (), ""),
    "gemm-v4": ("v4", "auto", (), ""),
    "gemm-v5": ("v5", "auto", (), ""),
    "gemm-v5-split": ("v5", "auto", ("--wide-min-slice", "8"), ", K split into slices"),
    "gemm-v5-float4": ("v5", "auto", ("--hidden", "36"), ", H = 36: float4 staging"),
    "v1": ("auto", "v1", (), ""),
    "v2": ("auto", "v2", ("--hidden", "64", "65", "68", "94", "128", "129", "256"),
           ", at each H where the rule picks one of its entry points (kernels/README.md)"),
    "v3": ("auto", "v3", (), ", tiles of 4 columns"),
    "v3-wide": ("auto", "v3", ("--v3-min-tiles", "1"), ", the widest tiles"),
    "v3-float4": ("auto", "v3", ("--hidden", "36"), ", H = 36: float4 staging"),
}


def step(name, cmd, out: Path, timeout=900, env=None, lines=12, root=ROOT):
    """Run ``cmd`` in ``root`` (a copy of the project: this one unless given) with its output
    kept in the logs and its last ``lines`` printed: (exit status or None if skipped past the
    deadline, output)."""
    start = time.time()
    if DEADLINE is not None:
        timeout = min(timeout, DEADLINE - start)
        if timeout < 5:
            print(f"\n=== {name}: skipped, past --deadline", flush=True)
            return None, "skipped: past --deadline"
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_env(env, root), cwd=root)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        text, code = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout} s", 124
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.log").write_text(text)
    tail = "\n".join(text.strip().splitlines()[-lines:])
    print(tail, flush=True)
    print(f"--- {name}: exit {code}, {time.time() - start:.0f} s", flush=True)
    return code, text


def outcome(code, text, ok="ok (table in run.txt)") -> str:
    """A step's line in the summary: ``text`` where it was skipped (``code`` None), ``ok`` where
    it passed, else its exit status."""
    return text if code is None else ok if code == 0 else f"FAILED (exit {code})"


def sanitizer_errors(text: str):
    m = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: .*\((\d+) error", text)
    return int(m.group(1)) if m else None


def ceilings():
    """(bytes/s of a large device-to-device copy, counting read + write; float32 FLOP/s of a
    large cuBLAS product without TF32), measured here, as METHOD.md asks."""
    import cupy as cp

    n = 1 << 28  # 1 GiB of float32
    a = cp.ones(n, cp.float32)
    b = cp.empty_like(a)
    m = 8192
    x = cp.random.default_rng(0).standard_normal((m, m), dtype=cp.float32)
    y = cp.random.default_rng(1).standard_normal((m, m), dtype=cp.float32)
    def best(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return min(times)
    bandwidth = 2 * 4 * n / best(lambda: b.__setitem__(Ellipsis, a))
    rate = 2 * m ** 3 / best(lambda: x @ y)
    return bandwidth, rate


def kernel_work(kernel, cell, T, N, I, H):
    """(FLOPs, fewest bytes) of one op's dispatches of ``kernel`` (D = 1, with an input weight,
    training): each input read once, each output written once, R read once."""
    G = {"single_gate": 1, "gru": 3, "lstm": 4}[cell]
    Z = 4 if cell == "gru" else G  # the GRU of the bench has reset_after: q in z_state
    rows, GH = T * N, G * H
    cells = 2 if cell == "lstm" else 1  # h (and c) per step
    kernel = re.sub(r"_v[23](_\w+)?$", "", kernel)
    if kernel.endswith("_forward"):
        return 2 * rows * GH * H, 4 * (rows * GH + rows * H * cells + rows * Z * H + GH * H)
    if kernel.endswith("_backward"):
        return 2 * rows * GH * H, 4 * (rows * H * (1 + cells) + rows * Z * H + rows * GH + rows * H + GH * H)
    # the GEMMs, every version: projection, dR, d_source, dW
    flops = 2 * rows * (I * GH + GH * H + GH * I + GH * I)
    return flops, 4 * (rows * I * 2 + rows * GH * 4 + rows * H + GH * (I + H) * 2)


#: the GEMM versions the bench times, each forced for a whole op, and the rule ("auto"): the
#: label of each in the tables -> the bench configuration (STEP_CONFIGS) that measures it
GEMM_CONFIGS = {"v1": "v1", "v3": "gemm v3", "v5": "gemm v5", "auto": "auto"}
GEMM_LABELS = tuple(GEMM_CONFIGS)
CELL_MODES = {"RNN": "RNN_TANH", "GRU": "GRU", "LSTM": "LSTM"}  # --cells: the bench's names
#: each rnngrad cell's cuDNN mode (torch.nn layer), the bench's name of it
MODES = {"single_gate": "RNN_TANH", "gru": "GRU", "lstm": "LSTM"}


def torch_layer(name: str):
    """The torch.nn layer class of a cell: an rnngrad name (``MODES``' keys) or a cuDNN mode."""
    import torch

    mode = MODES.get(name, name)
    return {"RNN_TANH": torch.nn.RNN, "GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM}[mode]


#: the recurrence versions the rule does not pick, as (label, RNNGRAD_METAL_RECURRENCE, versions
#: settings): v2 (one row a threadgroup) and v3 at three widths of tile (versions.Rules.v3_min_tiles)
STEP_KNOBS = (("v2", "v2", {}),
              ("v3", "v3", {}),
              ("v3 wide", "v3", dict(v3_min_tiles=32)),
              ("v3 narrow", "v3", dict(v3_min_tiles=1024)))
STEP_LABELS = tuple(label for label, _, _ in STEP_KNOBS)
#: settings of versions under which the bench also times the rule end to end (where they change
#: which kernels run): the rule without its one-step grids, and with them from a step of 2**23
#: multiply-adds (versions.Rules.steps_min_work)
E2E_VARIANTS = {"no one-step grids": dict(steps_min_work=None),
                "one-step grids from 2**23": dict(steps_min_work=2 ** 23)}
#: the bench's configurations, the version rule last: (label, recurrence, GEMM, versions settings)
STEP_CONFIGS = (("v1", "v1", "v1", {}),
                *((config, "auto", v, {}) for v, config in GEMM_CONFIGS.items() if config.startswith("gemm")),
                *((label, recurrence, "auto", knobs) for label, recurrence, knobs in STEP_KNOBS),
                ("auto", "auto", "auto", {}))


def versions_set(knobs: dict):
    """A block in which the Metal version rules have the settings ``knobs``
    (``versions.overrides``; none: nothing changes)."""
    from rnngrad.backends.metal import versions

    return versions.overrides(**knobs)


def wall(fn, reps: int) -> float:
    """ms per call of ``fn`` over ``reps`` calls, from a synchronised GPU to a synchronised GPU,
    as a user times it."""
    import cupy as cp

    cp.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - start) * 1e3 / reps


#: windows of the paired end-to-end measurement (paired_walls)
WALL_WINDOWS = 7


def paired_walls(first, second, reps: int, windows: int = WALL_WINDOWS, timer=None) -> tuple:
    """(ms per call of ``first``, of ``second``): each the median over ``windows`` windows of
    ``reps`` calls (``timer(fn, reps)``, default :func:`wall`), the two alternating window by
    window. The host behind a GPU drifts by ±15 % within seconds at 50×1 (one cuDNN wall went
    0.66 → 1.14 ms between runs), so rnngrad's and cuDNN's walls are taken side by side and the
    median drops the windows a hiccup hit."""
    timer = timer or wall
    a, b = [], []
    for _ in range(windows):
        a.append(timer(first, reps))
        b.append(timer(second, reps))
    return statistics.median(a), statistics.median(b)


def device_ms(fn) -> dict:
    """One call of ``fn`` under torch.profiler (CUPTI: the device's own start and end of every
    kernel, copy and fill, whoever launched it): ms of device time by kernel name, the dispatches
    of Metal kernel k as k (the GEMMs as "GEMMs"), anything else (the harness's fills and copies,
    CuPy's kernels) as "other"; and "span", the ms from the first activity's start to the last
    one's end (device time plus the gaps where the GPU waited for the host).

    The CUDA events around each dispatch (``Dispatch.seconds``) start when the stream reaches
    them, so they also count the host's time to launch the kernel whenever the GPU is waiting
    for it: a few µs per dispatch, which decides the one-step grids' totals."""
    import cupy as cp
    import torch

    try:
        from rnngrad.backends.metal.cuda._build import LAUNCHER_PREFIX as LAUNCHER
    except ImportError:  # a tree from before the CUDA target left the harness (gpu_ab.py)
        from rnngrad.backends.metal.harness.cuda._build import LAUNCHER_PREFIX as LAUNCHER

    cp.cuda.Device().synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        cp.cuda.Device().synchronize()
    out, first, last = {}, None, None
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name
        if name.startswith(LAUNCHER):
            name = name[len(LAUNCHER):]
            name = "GEMMs" if name.startswith("strided_gemm") else name
        else:
            name = "other"
        out[name] = out.get(name, 0.0) + e.time_range.elapsed_us() / 1e3
        first = e.time_range.start if first is None else min(first, e.time_range.start)
        last = e.time_range.end if last is None else max(last, e.time_range.end)
    out["span"] = 0.0 if first is None else (last - first) / 1e3
    return out


def dispatch_ms(per_kernel: dict) -> float:
    """The ms of a device_ms result's Metal dispatches (without "other" and "span")."""
    return sum(v for k, v in per_kernel.items() if k not in ("other", "span"))


def recurrence_ms(measured: dict, direction: str, key: str = "per_kernel") -> float:
    """The ms of a configuration's forward or backward recurrence dispatches (either version)."""
    return sum(v for k, v in measured[key].items()
               if re.search(f"_{direction}(_v2_\\w+|_v3)?$", k))


def metal_step(layer, x, gy, backend: str = "metal-cuda", xp=None):
    """One forward + gradients of ``layer`` (an ``rnngrad.convert.torch`` layer), as a training
    step calls them: its arguments for the input ``x`` [T,N,I] made arrays of ``xp`` (CuPy by
    default: on the GPU), ``gy`` [T,N,H] the output's gradient, on ``backend``. Returns the
    call (no arguments; the gradients' result)."""
    import dataclasses

    import numpy as np

    import rnngrad as rg

    if xp is None:
        import cupy as xp
    cell = layer.cell
    args = {k: (xp.asarray(v) if isinstance(v, np.ndarray) else v)
            for k, v in layer.arguments(x).items()}
    name = {"single_gate": "single_gate_rnn"}.get(cell, cell)
    forward, gradients = getattr(rg, name), getattr(rg, name + "_gradients")
    desc = dataclasses.replace(layer.descriptor, training=True)

    def step():
        res = forward(**args, descriptor=desc, backend=backend)
        saved = {"output_fwd": res.state} if cell == "gru" else (
            {"cell_output_fwd": res.cell} if cell == "lstm" else {})
        rest = {k: v for k, v in args.items() if k not in ("source", "recurrent_weight")}
        return gradients(args["source"], args["recurrent_weight"], gy, res.z_state, **saved,
                         **rest, descriptor=desc, backend=backend)
    return step


def bench(out: Path, quick: bool, cells=tuple(CELL_MODES), shapes=None):
    """rnngrad metal-cuda against cuDNN at ``shapes`` (default SHAPES) for ``cells``; returns rows."""
    import cupy as cp
    import torch

    from rnngrad.backends.metal.harness.contexts import cuda_device
    from rnngrad.convert import torch as rgt

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    shapes = shapes or (SHAPES[:2] if quick else SHAPES)
    for T, N, I, H in shapes:
        for mode in MODES.values():
            if mode not in {CELL_MODES[c] for c in cells}:
                continue
            cls = torch_layer(mode)
            torch.manual_seed(0)
            module = cls(I, H).cuda()
            layer = rgt.from_module(module.cpu())
            module = module.cuda()
            x = torch.randn(T, N, I, device="cuda")
            gy = torch.randn(T, N, H, device="cuda")
            # cuDNN: wall (CUDA events) and kernel time (profiler)
            def torch_step():
                module.zero_grad(set_to_none=True)
                xi = x.detach().requires_grad_()
                y = module(xi)[0]
                y.backward(gy)
            for _ in range(3):
                torch_step()
            torch.cuda.synchronize()
            reps = 20 if T * N * H < 10 ** 7 else 5
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(reps):
                torch_step()
            e1.record()
            torch.cuda.synchronize()
            torch_wall = e0.elapsed_time(e1) / reps
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                torch_step()
                torch.cuda.synchronize()
            torch_kernel = sum(e.device_time_total for e in prof.key_averages()) / 1e3  # ms
            # rnngrad: arguments on the GPU
            cell = layer.cell
            rnngrad_step = metal_step(layer, x.cpu().numpy(), cp.asarray(gy.cpu().numpy()))
            measured = {}
            with cuda_device() as dev:
                # v1 everywhere (the baseline), each tiled GEMM forced, the recurrence versions
                # the rule does not pick (STEP_KNOBS), then the version rule
                for config, recurrence, gemm, knobs in STEP_CONFIGS:
                    os.environ["RNNGRAD_METAL_GEMM"] = gemm
                    os.environ["RNNGRAD_METAL_RECURRENCE"] = recurrence
                    with versions_set(knobs):
                        for _ in range(2):
                            rnngrad_step()
                        cp.cuda.Device().synchronize()
                        dev.trace.clear()
                        rnngrad_step()
                        cp.cuda.Device().synchronize()
                        per_kernel = {}
                        for d in dev.trace:
                            name = "GEMMs" if d.kernel.startswith("strided_gemm") else d.kernel
                            per_kernel[name] = per_kernel.get(name, 0.0) + d.seconds * 1e3
                        measured[config] = dict(per_kernel=per_kernel,
                                                kernels=sorted({d.kernel for d in dev.trace}),
                                                dispatches=len(dev.trace),
                                                device=device_ms(rnngrad_step))
                kernel_ms = sum(per_kernel.values())
                dispatches = measured["auto"]["dispatches"]
            # end to end as a user's call runs: on a device that records no timing events (the
            # backend's own device does not), in windows alternating with cuDNN's
            with cuda_device(timing=False):
                rnngrad_step()
                wall_ms, torch_paired = paired_walls(rnngrad_step, torch_step, reps)
            # the same without filling new buffers with NaN (the harness's poison, which a Mac
            # does not do): how much of the host overhead the fills are
            with cuda_device(poison=False, timing=False):
                rnngrad_step()
                wall_unpoisoned_ms = wall(rnngrad_step, reps)
            # the rule with each of E2E_VARIANTS' settings, end to end, where it changes a choice
            variant_wall_ms = {}
            for name, knobs in E2E_VARIANTS.items():
                with versions_set(knobs), cuda_device(timing=False) as variant:
                    rnngrad_step()
                    cp.cuda.Device().synchronize()
                    if {d.kernel for d in variant.trace} != set(measured["auto"]["kernels"]):
                        variant_wall_ms[name] = wall(rnngrad_step, reps)
            if (T, N, mode) == (50, 1, "LSTM"):  # where the host overhead dominates: where it goes
                import cProfile
                import io
                import pstats

                profile = cProfile.Profile()
                with cuda_device(timing=False):
                    rnngrad_step()
                    profile.enable()
                    for _ in range(20):
                        rnngrad_step()
                    cp.cuda.Device().synchronize()
                    profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
                (out / "host-profile.txt").write_text(text.getvalue())
                print("host profile of 20 LSTM 50x1 steps (forward + gradients), by own time:")
                print("\n".join(text.getvalue().strip().splitlines()[:24]), flush=True)
            v1_ms = sum(measured["v1"]["per_kernel"].values())
            shares = {}
            for k, ms in per_kernel.items():
                f, nbytes = kernel_work(k, cell, T, N, I, H)
                shares[k] = dict(us_per_step=ms * 1e3 / T, flop_fraction=f / (ms / 1e3) / CEILINGS[1],
                                 bandwidth_fraction=nbytes / (ms / 1e3) / CEILINGS[0])
            G = {"RNN_TANH": 1, "GRU": 3, "LSTM": 4}[mode]
            flops = 6 * T * N * (I + H) * G * H
            device = measured["auto"]["device"]
            row = dict(cell=mode, shape=f"{T}x{N}x{I}x{H}", rnngrad_kernel_ms=kernel_ms,
                       rnngrad_device_ms=dispatch_ms(device), rnngrad_device_all_ms=
                       dispatch_ms(device) + device.get("other", 0.0), rnngrad_span_ms=device["span"],
                       device_per_kernel_ms=device,
                       v1_device_ms=dispatch_ms(measured["v1"]["device"]),
                       rnngrad_wall_ms=wall_ms, rnngrad_wall_unpoisoned_ms=wall_unpoisoned_ms,
                       variant_wall_ms=variant_wall_ms,
                       cudnn_kernel_ms=torch_kernel, cudnn_wall_ms=torch_paired,
                       cudnn_wall_events_ms=torch_wall,
                       dispatches=dispatches, per_kernel_ms=per_kernel, per_kernel=shares,
                       v1_kernel_ms=v1_ms, v1_per_kernel_ms=measured["v1"]["per_kernel"],
                       kernels=measured["auto"]["kernels"],
                       gemm_ms={v: measured[c]["per_kernel"].get("GEMMs") for v, c in
                                GEMM_CONFIGS.items()},
                       gflops=flops / kernel_ms / 1e6,
                       steps_forward_ms={c: recurrence_ms(measured[c], "forward")
                                         for c in ("auto", *STEP_LABELS)},
                       steps_backward_ms={c: recurrence_ms(measured[c], "backward")
                                          for c in ("auto", *STEP_LABELS)},
                       steps_dispatches={c: measured[c]["dispatches"] for c in STEP_LABELS},
                       steps_device_ms={c: (recurrence_ms(measured[c], "forward", "device"),
                                            recurrence_ms(measured[c], "backward", "device"))
                                        for c in ("v1", "auto", *STEP_LABELS)},
                       gemm_device_ms={v: measured[c]["device"].get("GEMMs") for v, c in
                                       GEMM_CONFIGS.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "bench.json").write_text(json.dumps(rows, indent=1))
    return rows


def fast_math_check() -> int:
    """Every cell, forward and gradients, under metalcompute's fast math: the worst error as a
    fraction of the float32 tolerance, per kind of quantity (the rows of the tolerance table)."""
    import numpy as np

    from rnngrad.backends.metal.harness.contexts import cuda_device
    from rnngrad.testing import check_case
    from rnngrad.testing.cases import CELLS, random_case, random_descriptor
    from rnngrad.testing.compare import KINDS

    worst = {}
    failed = {}
    with cuda_device(fast_math=True):
        rng = np.random.default_rng(0)
        for cell in CELLS:
            for _ in range(20):
                case = random_case(rng, cell, T=6, N=5, I=7, H=9, descriptor=random_descriptor(rng, cell),
                                   dtype=np.float32)
                for gradients in (False, True):
                    ratio, mismatches = check_case(case, "metal-cuda", gradients)
                    key = (cell, "gradients" if gradients else "forward")
                    worst[key] = max(worst.get(key, 0.0), ratio)
                    for m in mismatches:
                        failed.setdefault(KINDS.get(m.quantity, m.quantity), set()).add(m.quantity)
    for (cell, op), r in sorted(worst.items()):
        print(f"{cell:12s} {op:10s} worst error {r:8.2f} × the float32 tolerance")
    kinds = ("output", "state", "parameter")
    print("rows that survive fast math: " + ", ".join(k for k in kinds if k not in failed)
          + "; exceeded: " + (", ".join(f"{k} ({', '.join(sorted(v))})" for k, v in failed.items()) or "none"))
    return 0


CEILINGS = (3.0e12, 5.0e13)  # replaced by measured values before the bench


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--quick", action="store_true", help="fewer examples and shapes")
    parser.add_argument("--skip", nargs="*", default=(),
                        choices=("tests", "verify", "sanitizer", "fast-math", "bench", "cli-bench"),
                        help="steps to leave out (cli-bench: the `rnngrad bench` run within the bench step)")
    parser.add_argument("--also", nargs="*", default=(),
                        choices=("layer", "compile", "host", "step", "mps"),
                        help="steps beyond the default ones: layer (bench_layer.py --device cuda: "
                        "rnngrad.torch's layer beside its ops and cuDNN), compile (the same with "
                        "both under torch.compile(mode='reduce-overhead')), host (gpu_host.py at "
                        "50x1x64x64: where an op's host time goes, in each --baseline copy, then "
                        "here), step (gpu_step_profile.py: an eager training step under "
                        "torch.profiler, the CUDA calls that wait, a trace in logs), mps (the "
                        "metal-mps stand-in on CUDA: rnngrad verify and bench_mps.py --standin "
                        "cuda)")
    parser.add_argument("--baseline", nargs="*", default=(), metavar="TREE",
                        help="copies of the project (gpu_ab.py's trees, such as ab/base) whose "
                        "host time --also host measures before this tree's")
    parser.add_argument("--tests-k", default=None, metavar="EXPR",
                        help="run only the GPU tests pytest's -k EXPR selects")
    parser.add_argument("--cells", nargs="*", default=list(CELL_MODES), choices=list(CELL_MODES),
                        help="the cells the bench measures (default: all)")
    parser.add_argument("--shapes", nargs="*", default=None, metavar="TxNxIxH",
                        help="the bench's shapes (default: " + ", ".join("x".join(map(str, s)) for s in SHAPES) + ")")
    parser.add_argument("--fast-math-check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sanitize", nargs="*", default=list(SANITIZER_CONFIGS), choices=list(SANITIZER_CONFIGS),
                        metavar="CONFIG", help="the version settings compute-sanitizer runs under: "
                        + ", ".join(SANITIZER_CONFIGS) + " (default: all)")
    parser.add_argument("--no-defects", dest="defects", action="store_false",
                        help="skip the planted defect kernels (they show the tools catch each kind of fault)")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="end every subprocess step within this many seconds of the start; later "
                        "steps are reported as skipped")
    args = parser.parse_args(argv)
    if args.baseline and "host" not in args.also:
        parser.error("--baseline: only --also host measures the copies it names; add it")
    for tree in args.baseline:
        if not (Path(tree) / "verification" / "gpu_host.py").is_file():
            parser.error(f"--baseline: expected a copy of the project (a folder holding "
                         f"verification/gpu_host.py), got {tree!r}")
    if args.deadline is not None:
        global DEADLINE
        DEADLINE = time.time() + args.deadline
    if args.fast_math_check:
        return fast_math_check()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "run.txt", "w") as record:
        stdout, sys.stdout = sys.stdout, _Tee(sys.stdout, record)
        try:
            return _run(args, out)
        finally:
            sys.stdout = stdout
            logs = out / "logs"
            if logs.is_dir():  # a few files come back from a lent machine more surely than many
                shutil.make_archive(str(logs), "gztar", logs)
                shutil.rmtree(logs)


class _Tee:
    """Writes to the terminal and to run.txt."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def _run(args, out: Path) -> int:
    py = sys.executable
    summary = []

    code, text = step("environment", [py, "-c", (
        "import cupy, torch, numpy; from rnngrad.backends.metal import cuda; "
        "print('GPU', cuda.get_devices()); print('cupy', cupy.__version__, 'torch', torch.__version__, "
        "'cuDNN', torch.backends.cudnn.version(), 'CUDA', cupy.cuda.runtime.runtimeGetVersion())")], out)
    summary.append(("environment", "ok" if code == 0 else f"exit {code}"))
    code, text = step("compile", [py, "-c", (
        "from rnngrad.backends.metal.backends import CUDA_HOST as h; from rnngrad.backends.metal import library;"
        "[print(k, 'regs', h.function(k).registers, 'tg', h.function(k).threadgroup_size(), 'smem', "
        "h.function(k).threadgroup_memory, 'local', h.function(k).local_memory) for k in library.BUFFERS]")], out)
    summary.append(("NVRTC compile of kernels/", "ok" if code == 0 else f"FAILED (exit {code})"))
    if code != 0:
        return _report(summary)
    if "tests" not in args.skip:
        code, text = step("pytest -m gpu", [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                             *(["-k", args.tests_k] if args.tests_k else [])], out)
        last = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed)", l)]
        summary.append(("pytest -m gpu", text if code is None else last[-1] if last else f"exit {code}"))
    if "verify" not in args.skip:
        code, text = step("rnngrad verify --backend metal-cuda",
                          [py, "-m", "rnngrad", "verify", "--backend", "metal-cuda"], out)
        summary.append(("rnngrad verify --backend metal-cuda",
                        outcome(code, text, "passed")))
    for mode in [m for m in ("layer", "compile") if m in args.also]:
        extra = ["--compile", "reduce-overhead"] if mode == "compile" else []
        code, text = step(" ".join(["bench_layer.py --device cuda", *extra]),
                          [py, "verification/bench_layer.py", "--device", "cuda", "--passes", "3",
                           *extra, "--json", str(out / f"{mode}.json")], out, timeout=600, lines=30)
        summary.append(("rnngrad.torch layer beside its ops and cuDNN"
                        + (", both under torch.compile(mode='reduce-overhead')" if extra else ""),
                        outcome(code, text)))
    if "host" in args.also:
        # each copy's own script, so that a copy from before a change is timed as it was
        for tree in [*args.baseline, ROOT]:
            tree = Path(tree).resolve()
            label = "this tree" if tree == ROOT else os.path.relpath(tree, ROOT)
            code, text = step(f"gpu_host.py in {label}",
                              [py, "verification/gpu_host.py", "--shapes", "50x1x64x64"], out,
                              lines=8, root=tree)
            summary.append((f"host time per op at 50x1x64x64 (gpu_host.py), {label}",
                            outcome(code, text)))
    if "step" in args.also:
        trace = out / "logs"
        trace.mkdir(exist_ok=True)
        code, text = step("gpu_step_profile.py", [py, "verification/gpu_step_profile.py",
                                                  "--out", str(trace)], out, lines=4)
        waits = re.search(r"wait for the device: (.*)", text or "")
        summary.append(("an eager training step under torch.profiler: CUDA calls that wait",
                        outcome(code, text, waits.group(1) if waits else "FAILED (exit 0)")))
    if "mps" in args.also:
        code, text = step("rnngrad verify --backend metal-mps (stand-in on CUDA)",
                          [py, "-m", "rnngrad", "verify", "--backend", "metal-mps",
                           "--skip-reference"], out, env={"RNNGRAD_MPS_STANDIN": "cuda"})
        summary.append(("rnngrad verify --backend metal-mps (stand-in)",
                        outcome(code, text, "passed")))
        code, text = step("bench_mps.py --standin cuda",
                          [py, "verification/bench_mps.py", "--standin", "cuda"], out, timeout=600, lines=30)
        summary.append(("training step: metal-mps stand-in vs metal-cuda",
                        outcome(code, text)))
    if "sanitizer" not in args.skip:
        for config in args.sanitize:
            gemm, recurrence, extra, note = SANITIZER_CONFIGS[config]
            what = f"GEMM {gemm}" + (f", recurrences {recurrence}" if recurrence != "auto" else "")
            what += note
            for tool in TOOLS:
                code, text = step(f"sanitizer {tool} {what}", ["compute-sanitizer", "--tool", tool,
                                                               *TOOL_OPTIONS.get(tool, ()), py,
                                                               "verification/gpu_sanitize.py", *extra],
                                  out, env={"RNNGRAD_METAL_GEMM": gemm,
                                            "RNNGRAD_METAL_RECURRENCE": recurrence})
                summary.append((f"compute-sanitizer {tool}, every cell, {what}",
                                f"{sanitizer_errors(text)} errors, exit {code}" if code is not None else text))
        from gpu_sanitize import DEFECTS  # noqa: E402
        for defect in DEFECTS if args.defects else ():
            caught, ran = [], 0
            for tool in TOOLS:
                code, text = step(f"defect {defect} {tool}", ["compute-sanitizer", "--tool", tool,
                                                              *TOOL_OPTIONS.get(tool, ()), py,
                                                              "verification/gpu_sanitize.py", "--defect", defect], out)
                ran += code is not None  # None: skipped, past --deadline
                n = sanitizer_errors(text)
                if n:
                    caught.append(f"{tool}({n})")
            verdict = "caught by " + ", ".join(caught) if caught else "caught by none"
            summary.append((f"defect {defect}", verdict if ran else "skipped: past --deadline"))
    if "fast-math" not in args.skip:
        code, text = step("fast math", [py, "verification/gpu_run.py", "--fast-math-check"], out)
        summary.append(("fast math (metalcompute's compile mode)", text.strip().splitlines()[-1] if text.strip() else f"exit {code}"))
    if "bench" not in args.skip:
        if "cli-bench" not in args.skip:
            code, text = step("rnngrad bench --backends metal-cuda",
                              [py, "-m", "rnngrad", "bench", "--backends", "metal-cuda", "--passes", "3",
                               "--json", str(out / "rnngrad-bench.json")], out)
            summary.append(("rnngrad bench --backends metal-cuda",
                            outcome(code, text, "ok")))
        try:
            global CEILINGS
            CEILINGS = ceilings()
            print(f"\nceilings: copy {CEILINGS[0] / 1e12:.2f} TB/s (read + write), float32 product "
                  f"{CEILINGS[1] / 1e12:.1f} TFLOP/s (no TF32)")
            shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes] if args.shapes else None
            rows = bench(out, args.quick, args.cells, shapes)
            print("\n| cell | T×N×I×H | rnngrad kernel ms | v1 kernel ms | × over v1 | cuDNN kernel ms | "
                  "÷ cuDNN | rnngrad e2e ms | e2e, no poison ms | cuDNN wall ms | e2e ÷ wall | "
                  "dispatches |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['cell']} | {r['shape']} | {r['rnngrad_kernel_ms']:.3f} | {r['v1_kernel_ms']:.3f} | "
                      f"{r['v1_kernel_ms'] / r['rnngrad_kernel_ms']:.1f} | {r['cudnn_kernel_ms']:.3f} | "
                      f"{r['rnngrad_kernel_ms'] / r['cudnn_kernel_ms']:.2f} | {r['rnngrad_wall_ms']:.3f} | "
                      f"{r['rnngrad_wall_unpoisoned_ms']:.3f} | "
                      f"{r['cudnn_wall_ms']:.3f} | {r['rnngrad_wall_ms'] / r['cudnn_wall_ms']:.2f} | "
                      f"{r['dispatches']} |")
            variants = [(r, name, ms) for r in rows for name, ms in r.get("variant_wall_ms", {}).items()]
            if variants:
                print("\n| cell | T×N×I×H | the rule with | e2e ms | the rule's e2e ms | cuDNN wall ms |")
                print("|---|---|---|---|---|---|")
                for r, name, ms in variants:
                    print(f"| {r['cell']} | {r['shape']} | {name} | {ms:.3f} | "
                          f"{r['rnngrad_wall_ms']:.3f} | {r['cudnn_wall_ms']:.3f} |")
            print("\nDevice time (torch.profiler, the method of cuDNN's column): the rule's dispatches, "
                  "with the harness's fills and copies, and the span from the first to the last "
                  "activity on the GPU")
            print("\n| cell | T×N×I×H | dispatches' device ms | ÷ cuDNN | + fills and copies ms | "
                  "span ms | v1 device ms | cuDNN kernel ms |")
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['cell']} | {r['shape']} | {r['rnngrad_device_ms']:.3f} | "
                      f"{r['rnngrad_device_ms'] / r['cudnn_kernel_ms']:.2f} | {r['rnngrad_device_all_ms']:.3f} | "
                      f"{r['rnngrad_span_ms']:.3f} | {r['v1_device_ms']:.3f} | {r['cudnn_kernel_ms']:.3f} |")
            print("\n| cell | T×N×I×H | " + " | ".join(f"{c} fwd / bwd device ms" for c in ("v1", *STEP_LABELS))
                  + " | GEMMs device ms " + " / ".join(GEMM_LABELS) + " |")
            print("|---|---|" + "---|" * (len(STEP_LABELS) + 2))
            for r in rows:
                sd, gd = r["steps_device_ms"], r["gemm_device_ms"]
                print(f"| {r['cell']} | {r['shape']} | "
                      + " | ".join(f"{sd[c][0]:.3f} / {sd[c][1]:.3f}" for c in ("v1", *STEP_LABELS))
                      + " | " + " / ".join(f"{gd[v] or 0:.3f}" for v in GEMM_LABELS) + " |")
            print("\n| cell | T×N×I×H | kernels by the rule | v1 ms by kernel | rule ms by kernel |")
            print("|---|---|---|---|---|")
            for r in rows:
                v1 = ", ".join(f"{k} {v:.2f}" for k, v in r["v1_per_kernel_ms"].items())
                now = ", ".join(f"{k} {v:.2f}" for k, v in r["per_kernel_ms"].items())
                print(f"| {r['cell']} | {r['shape']} | {', '.join(r['kernels'])} | {v1} | {now} |")
            print("\n| cell | T×N×I×H | " + " | ".join(f"GEMMs {v} ms" for v in GEMM_LABELS) + " |")
            print("|---|---|" + "---|" * len(GEMM_LABELS))
            for r in rows:
                print(f"| {r['cell']} | {r['shape']} | "
                      + " | ".join(f"{r['gemm_ms'][v]:.3f}" for v in GEMM_LABELS) + " |")
            print("\n| cell | T×N×I×H | recurrences by the rule, forward / backward ms | "
                  + " | ".join(f"{label}, forward / backward ms (dispatches)"
                               for label in STEP_LABELS) + " |")
            print("|---|---|---|" + "---|" * len(STEP_LABELS))
            for r in rows:
                fw, bw = r["steps_forward_ms"], r["steps_backward_ms"]
                print(f"| {r['cell']} | {r['shape']} | {fw['auto']:.3f} / {bw['auto']:.3f} | "
                      + " | ".join(f"{fw[c]:.3f} / {bw[c]:.3f} ({r['steps_dispatches'][c]})"
                                   for c in STEP_LABELS) + " |")
            print("\n| cell | T×N×I×H | kernel | µs/step | % FLOP rate | % bandwidth |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                for k, v in r["per_kernel"].items():
                    print(f"| {r['cell']} | {r['shape']} | {k} | {v['us_per_step']:.1f} | "
                          f"{100 * v['flop_fraction']:.1f} | {100 * v['bandwidth_fraction']:.1f} |")
            summary.append(("bench", f"{len(rows)} rows, bench.json"))
        except Exception as exc:  # report and go on to the summary
            import traceback

            traceback.print_exc()
            summary.append(("bench", f"FAILED: {type(exc).__name__}: {exc}"))
    return _report(summary)


def _report(summary) -> int:
    """Print the summary last; 1 if anything failed."""
    print("\n=== summary")
    for a, b in summary:
        print(f"{a:45s} {b}")
    return 1 if any("FAIL" in b for _, b in summary) else 0


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]
    raise SystemExit(main())
