"""``rnngrad bench``: rnngrad's backends against PyTorch's modules, each in its own process.

On the CPU, PyTorch's CPU modules; with a GPU backend (``--backends metal-cuda``), PyTorch's
cuDNN modules on the same GPU (TF32 off), the inputs already on the GPU, every run synchronised.

For every cell and shape, each implementation runs in a process of its own
(``rnngrad.bench.worker``), started once and kept alive, and the processes take turns, one
timing window each ("pass"; who goes first alternates), a moment apart: one runs while the
others wait idle, so no two thread pools share the cores. The table shows the median time of
forward + gradients, µs per time step, GFLOP/s, the fraction of the GEMM rate measured in the
same run and the ratio to PyTorch (below 1: rnngrad is faster), the median and the range of
that ratio over the passes ("paired", "per pass": each pass's median against PyTorch's median
of the same pass, timed just before or after it; on a machine whose speed drifts, the paired
median compares runs taken at the same speed, and the spread says how far one ratio can be
trusted) and the first call of each worker ("first s": setup, loading or compiling kernels,
and one forward + gradients).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HELP = "time rnngrad's backends against PyTorch's nn.RNN/GRU/LSTM (forward + backward)"

DEFAULT_SHAPES = ("100x32x256x256", "50x1x64x64", "200x64x512x512", "1000x8x128x128")
CELL_NAMES = {"single_gate": "RNN", "gru": "GRU", "lstm": "LSTM"}
GATES = {"single_gate": 1, "gru": 3, "lstm": 4}
#: seconds between one worker's window and the next's, for the threads of the one that just
#: ran to stop spinning and sleep: OpenBLAS's spin for a while after a call, and a window
#: started sooner ran its first part at half speed (verification/PERFORMANCE.md, 2026-11-24)
GAP = 0.2
#: timed runs of each GEMM-rate window
GEMM_REPEATS = 5
#: a GEMM-rate window below this fraction of the best one: the machine's speed drifted
DRIFT = 0.8


def _cell(name: str) -> str:
    """A cell given as the table prints it (RNN, GRU, LSTM) or as the ops name it."""
    lowered = name.lower()
    return {"rnn": "single_gate"}.get(lowered, lowered)


def add_arguments(parser):
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), metavar="TxNxIxH",
                        help="problem sizes: steps × batch × input features × hidden units "
                             f"(default {' '.join(DEFAULT_SHAPES)})")
    parser.add_argument("--cells", nargs="+", default=["single_gate", "gru", "lstm"], type=_cell,
                        choices=["single_gate", "gru", "lstm"],
                        help="cells to time, by the op's or the table's name (rnn for single_gate; "
                             "default all)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="dtype of every array (default float32)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of every implementation: numba's and PyTorch's (default 2)")
    parser.add_argument("--backends", nargs="+", default=["numba"],
                        help="rnngrad backends to time (default numba)")
    parser.add_argument("--passes", type=int, default=3, help="alternating passes (default 3)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per pass, at least (default 3)")
    parser.add_argument("--min-seconds", type=float, default=0.25,
                        help="each pass keeps timing until this much time has passed (default 0.25)")
    parser.add_argument("--warmup-seconds", type=float, default=0.1,
                        help="each pass first runs untimed for this long, at least once, so "
                             "that every implementation is timed warm (default 0.1)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--json", metavar="FILE", help="write all measurements as JSON")
    parser.add_argument("--plot", metavar="PNG", help="plot the ratios to PyTorch")


def flops(cell, T, N, I, H):
    """Forward + gradients: projection, recurrence (forward and backward), dW, dsource, dR."""
    G = GATES[cell]
    return 2.0 * T * N * G * H * (I + H) * 3


def gemm_summary(rates, dtype, threads, device="cpu") -> list:
    """Lines on the GEMM rates (GFLOP/s) of the run's GEMM-rate windows: the best, the lowest,
    and whether the machine's speed drifted (the lowest below ``DRIFT`` of the best). The rate
    is NumPy's on "cpu", cuBLAS's (through CuPy) on "cuda"."""
    best, lowest = max(rates), min(rates)
    how = f"{threads} threads, NumPy" if device == "cpu" else "cuBLAS through CuPy"
    lines = [f"GEMM rate ({dtype}, {how}): best {best:.1f} GFLOP/s"
             + (f", lowest {lowest:.1f} over {len(rates)} windows" if len(rates) > 1 else "")]
    if lowest < DRIFT * best:
        lines.append(f"this machine's speed drifted during the run (lowest GEMM rate "
                     f"{lowest / best:.0%} of the best): trust the paired ratios over the "
                     "medians, and their ranges say how far")
    return lines


def pass_ratios(mine, theirs):
    """Per pass: the median of ``mine`` over the median of ``theirs`` ([pass][run] times each),
    two measurements taken one right after the other."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(mine, theirs)]


def _env(threads):
    from .. import machine

    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    libs = [lib for lib in machine.blas_libraries().values() if lib is not None]
    better = machine.faster_coretype(libs[0].corename) if libs else None
    if better and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = better
    return env


class Worker:
    """One implementation's timing process (``rnngrad.bench.worker``), alive until closed."""

    def __init__(self, request, env):
        self.impl = request["impl"]
        self._stderr = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "rnngrad.bench.worker", json.dumps(request)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env)
        try:
            ready = self._reply()
        except BaseException:
            self.close()
            raise
        self.first, self.flops = ready["first"], ready.get("flops")
        self.versions = ready.get("versions", [])

    def _reply(self):
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            self._stderr.seek(0)
            raise RuntimeError(f"worker {self.impl} failed (exit code {self._proc.returncode}): "
                               f"{self._stderr.read().strip()[-500:]}")
        return json.loads(line)

    def window(self, repeats, min_seconds=0.0, warmup_seconds=0.0):
        """The times of one timing window: untimed runs for ``warmup_seconds`` (at least one
        when positive), then at least ``repeats`` runs and ``min_seconds``."""
        request = dict(repeats=repeats, min_seconds=min_seconds, warmup_seconds=warmup_seconds)
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._reply()["times"]

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _device(backends) -> str:
    """"cuda" when every backend asked for runs on the GPU, "cpu" when none does."""
    from .. import registry

    gpu = {}
    for name in backends:
        try:
            gpu[name] = registry.get(name).gpu
        except ValueError:  # unknown or unavailable here: its worker says so
            gpu[name] = False
    if len(set(gpu.values())) > 1:
        listing = ", ".join(f"{n} ({'GPU' if g else 'CPU'})" for n, g in gpu.items())
        raise SystemExit(f"rnngrad bench: --backends: expected backends of one device, got {listing}; "
                         f"time the GPU and the CPU backends in separate runs")
    return "cuda" if gpu and all(gpu.values()) else "cpu"


def _gpu_name() -> str:
    import cupy as cp

    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()


def _numba_gemms() -> list:
    """The numba backend's GEMM choice (each kind of product and dtype, and how it was made),
    as ``rnngrad info`` prints it; none without numba."""
    try:
        from ..backends.numba import blas
    except ImportError:
        return []
    return blas.CHOICE.describe()


def run(args) -> int:
    from .. import machine

    have_torch = not args.no_torch
    if have_torch:
        try:
            import importlib.util
            have_torch = importlib.util.find_spec("torch") is not None
        except ImportError:
            have_torch = False
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    device = _device(args.backends)
    impls = list(args.backends) + (["torch"] if have_torch else [])
    env = _env(args.threads)
    print("\n".join(machine.blas_report()) if device == "cpu" else
          f"device: {_gpu_name()} (CUDA); PyTorch runs cuDNN there, TF32 off")
    gemm_lines = _numba_gemms() if "numba" in args.backends else []
    if gemm_lines:
        print("numba backend GEMMs:\n" + "\n".join(f"  {line}" for line in gemm_lines))
    if env.get("OPENBLAS_CORETYPE"):
        print(f"workers run with OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}")
    points = [(cell, shape) for shape in shapes for cell in args.cells]
    results = {(c, s, i): [] for c, s in points for i in impls}  # every pass's times, in order
    passes = {(c, s, i): [] for c, s in points for i in impls}  # [pass][run] times
    firsts = {}
    chosen = {}  # (cell, shape, impl) -> the Metal host's version choices of the first call
    gemm = []
    total = len(points) * (len(impls) + args.passes * (len(impls) + 1))
    done = 0

    def progress(text):
        nonlocal done
        done += 1
        print(f"\r[{done}/{total}] {text}      ", end="", file=sys.stderr, flush=True)

    big = max(shapes, key=lambda s: s[0] * s[1] * s[3])
    with Worker(dict(impl="gemm", cell="lstm", T=big[0], N=big[1], I=big[2], H=big[3],
                     dtype=args.dtype, threads=args.threads, device=device), env) as gemm_worker:
        for cell, shape in points:
            T, N, I, H = shape
            name = f"{CELL_NAMES[cell]} {'x'.join(map(str, shape))}"
            with contextlib.ExitStack() as stack:
                workers = {}
                for impl in impls:  # one at a time: each first call has the cores to itself
                    workers[impl] = stack.enter_context(Worker(
                        dict(impl=impl, cell=cell, T=T, N=N, I=I, H=H, dtype=args.dtype,
                             threads=args.threads, device=device), env))
                    firsts[(cell, shape, impl)] = workers[impl].first
                    chosen[(cell, shape, impl)] = workers[impl].versions
                    progress(f"{name} {impl}: first call {workers[impl].first:.2f} s")
                for p in range(args.passes):
                    time.sleep(GAP)
                    gemm.append(gemm_worker.flops / min(gemm_worker.window(GEMM_REPEATS)) / 1e9)
                    progress(f"pass {p + 1} GEMM rate: {gemm[-1]:.1f} GFLOP/s")
                    for impl in impls if p % 2 == 0 else impls[::-1]:  # alternate who goes first
                        time.sleep(GAP)
                        times = workers[impl].window(args.repeats, args.min_seconds,
                                                     args.warmup_seconds)
                        results[(cell, shape, impl)].extend(times)
                        passes[(cell, shape, impl)].append(times)
                        progress(f"pass {p + 1} {name} {impl}: "
                                 f"{statistics.median(times) * 1e3:.2f} ms")
    print(file=sys.stderr)
    best_gemm = max(gemm)
    print()
    print("\n".join(gemm_summary(gemm, args.dtype, args.threads, device)))
    print("floor: the ratio to PyTorch an implementation would reach running every FLOP at the best GEMM rate")
    header = (f"{'cell':5} {'T×N×I×H':>16} {'impl':>10} {'median ms':>10} {'µs/step':>9} {'GFLOP/s':>8} "
              f"{'%GEMM':>6} {'vs torch':>9} {'paired':>7} {'per pass':>11} {'floor':>6} {'first s':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    for cell, shape in points:
        torch_med = statistics.median(results[(cell, shape, "torch")]) if have_torch else None
        for impl in impls:
            med = statistics.median(results[(cell, shape, impl)])
            gf = flops(cell, *shape) / med / 1e9
            ratio = med / torch_med if torch_med else None
            floor = flops(cell, *shape) / (best_gemm * 1e9) / torch_med if torch_med else None
            per_pass = pass_ratios(passes[(cell, shape, impl)],
                                   passes[(cell, shape, "torch")]) if have_torch else None
            paired = statistics.median(per_pass) if have_torch else None
            rows.append(dict(cell=cell, shape=shape, impl=impl, median_s=med,
                             us_per_step=med / shape[0] * 1e6, gflops=gf,
                             gemm_fraction=gf / best_gemm, ratio_to_torch=ratio,
                             paired_ratio=paired,
                             ratio_floor=floor, first_call_s=firsts[(cell, shape, impl)],
                             pass_ratios=per_pass, times=results[(cell, shape, impl)],
                             pass_times=passes[(cell, shape, impl)]))
            print(f"{CELL_NAMES[cell]:5} {'x'.join(map(str, shape)):>16} {impl:>10} {med * 1e3:10.2f} "
                  f"{med / shape[0] * 1e6:9.1f} {gf:8.1f} {gf / best_gemm:6.0%} "
                  + (f"{ratio:9.2f} {paired:7.2f} {min(per_pass):5.2f}–{max(per_pass):<5.2f} {floor:6.2f}"
                     if ratio is not None else f"{'-':>9} {'-':>7} {'-':>11} {'-':>6}")
                  + f" {firsts[(cell, shape, impl)]:8.2f}")
    if any(chosen.values()):
        print("\nkernel versions (the Metal host's choice for each dispatch of the first call, and why):")
        for (cell, shape, impl), lines in chosen.items():
            if lines:
                print(f"{CELL_NAMES[cell]} {'x'.join(map(str, shape))} {impl}:")
                print("\n".join(f"  {line.split(': ', 1)[-1]}" for line in lines))
        for row in rows:
            row["versions"] = chosen.get((row["cell"], tuple(row["shape"]), row["impl"]), [])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(blas=machine.blas_report(), numba_gemms=gemm_lines, gemm_gflops=gemm,
                           dtype=args.dtype, threads=args.threads, rows=rows), f, indent=1)
    if args.plot and have_torch:
        plot(rows, args.plot)
    return 0


def plot(rows, path):
    """A PNG of the ratios to PyTorch: bars the medians, whiskers the range of the per-pass
    ratios (the median over all runs may lie outside that range), a red tick the floor (the ratio
    at the best GEMM rate for every FLOP), where it is known."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    mine = [r for r in rows if r["impl"] != "torch"]
    x = range(len(mine))
    ax.bar(x, [r["ratio_to_torch"] for r in mine])
    ax.vlines(x, [min(r["pass_ratios"]) for r in mine], [max(r["pass_ratios"]) for r in mine],
              color="k", lw=1)
    floors = [(i, r["ratio_floor"]) for i, r in zip(x, mine) if r.get("ratio_floor") is not None]
    if floors:
        ax.scatter(*zip(*floors), marker="_", s=300, linewidths=2, color="C3", zorder=3,
                   label="floor: every FLOP at the best GEMM rate")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{CELL_NAMES[r['cell']]}\n{r['shape'][0]}x{r['shape'][1]}\n"
                        f"{r['shape'][2]}x{r['shape'][3]}\n{r['impl']}" for r in mine], fontsize=6)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("time / PyTorch time")
    ax.set_title("median ratio; whiskers: the range of the per-pass ratios", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
