"""The Metal backends: host code that runs the kernels of ``kernels/`` through metalcompute's API.

Three backends share this code and differ only in the device they are given:

- ``"metal"``: a real Apple GPU through ``metalcompute`` (macOS on Apple silicon); chosen by
  ``backend=None`` when available.
- ``"metal-emulated"``: the same kernels and host code on the CPU target of the harness,
  :mod:`rnngrad.backends.metal.harness.cpu` (any machine with a C++ compiler); only when asked for.
- ``"metal-cuda"``: the same kernels and host code on an NVIDIA GPU through the harness's CUDA
  target, :mod:`rnngrad.backends.metal.harness.cuda` (CuPy); only when asked for. It takes arrays
  already in GPU memory (CuPy arrays, CUDA tensors: anything with ``__cuda_array_interface__``)
  and returns CuPy arrays on the GPU for them, with no copy through the host; NumPy inputs are
  copied to the GPU once per call and the results come back as NumPy arrays.

Each op is a fixed, small number of dispatches whatever T is (contract and kernel files for the
math):

==========================  =======================================================================
forward                     [strided_gemm: x' = source·Wᵀ + b, when input_weight is given]
                            <cell>_forward: the whole sequence, both directions, one dispatch
gradients                   <cell>_backward: the whole BPTT recurrence, both directions
                            strided_gemm: dR = Σ lhsᵀ rhs over T·N rows, batched over directions
                            [strided_gemm ×2: d_source = dA·W, dW = dAᵀ·source, with input_weight]
                            [strided_gemm: db = Σ dA, with bias]
                            [strided_gemm: dpeephole / d_secondary_bias from per-row partials]
==========================  =======================================================================

Everything is float32 (the backends declare ``dtypes=(float32,)``). An absent optional input is
bound as zeros (init states, bias, secondary bias) or ones (mask); flags in the parameter struct
cover the inputs whose absence is not a neutral value (peephole, per-step cell gradient).
T = 0 and N = 0 are answered on the host (contract section 4): there is nothing to dispatch.

To run the emulated backend on a particular harness device (an adversarial schedule, a forced
threadgroup size), use :func:`emulated_device`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np

from ... import registry
from ...descriptors import Activation
from ...problem import ForwardArrays, GradientArrays
from . import library

F32 = np.float32


def _f32(a):
    if hasattr(a, "__cuda_array_interface__"):
        return a.astype(F32)
    return np.ascontiguousarray(a, dtype=F32)


class MetalHost:
    """Runs rnngrad's kernels on one metalcompute-compatible device.

    ``device_factory`` makes the device on first use (``metalcompute.Device`` or the harness's
    ``Device``); nothing else differs between the real GPU and the harness.
    """

    def __init__(self, device_factory, name: str):
        self._factory = device_factory
        self.name = name
        self._device = None
        self._functions = {}
        self._lock = threading.Lock()

    # -- device and kernels -------------------------------------------------------------------
    @property
    def device(self):
        if self._device is None:
            self._device = self._factory()
        return self._device

    def use(self, device):
        """Run on ``device`` from now on (its kernels are compiled again on first use)."""
        self._device = device
        self._functions = {}

    def function(self, name):
        if name not in self._functions:
            if "__library__" not in self._functions:
                self._functions["__library__"] = self.device.kernel(library.source())
            self._functions[name] = self._functions["__library__"].function(name)
        return self._functions[name]

    @property
    def xp(self):
        """The array module of the device's buffers: NumPy, or CuPy on the CUDA target."""
        return getattr(self.device, "array_module", np)

    def buffer(self, array):
        """A device buffer holding a copy of ``array`` (float32 unless it is a params struct)."""
        if hasattr(array, "__cuda_array_interface__"):  # already on the GPU: copied there
            xp = self.xp
            array = xp.ascontiguousarray(array, dtype=F32)
            return self.device.buffer(array if array.size else xp.zeros(1, F32))
        array = np.ascontiguousarray(array)
        if array.dtype.names is None:
            array = array.astype(F32, copy=False)
        else:
            array = array.view(np.uint8)  # a params struct: plain bytes for metalcompute
        if array.nbytes == 0:
            array = np.zeros(1, F32)  # Metal has no empty buffers; never read
        return self.device.buffer(array)

    def empty(self, n):
        """A float32 device buffer of ``n`` elements (at least one)."""
        return self.device.buffer(4 * max(int(n), 1))

    def launch(self, kernel, count, handles, **buffers):
        """Dispatch ``kernel`` over ``count`` threads, binding ``buffers`` by the names of its
        buffer table (``library.BUFFERS``)."""
        names = library.BUFFERS[kernel]
        if set(names) != set(buffers):
            raise ValueError(f"{kernel}: expected buffers {names}, got {tuple(buffers)}")
        handles.append(self.function(kernel)(int(count), *(buffers[n] for n in names)))

    def read(self, buf, shape):
        """The first prod(shape) floats of a buffer the op made: a NumPy copy, or on the CUDA
        target a CuPy view (the buffer is the op's own)."""
        n = int(np.prod(shape))
        if self.xp is np:
            return np.frombuffer(buf, F32, count=n).reshape(shape).copy()
        return buf.view(self.xp.float32)[:n].reshape(shape)

    def finish(self, handles):
        """Wait for the op's dispatches; a device that can report a failed one (the harness
        targets) raises its error here."""
        finish = getattr(self.device, "finish", None)
        if finish is not None:
            finish(handles)
        else:
            del handles[:]  # metalcompute waits when a handle is deleted

    def to_caller(self, problem, out):
        """Results where the inputs were: GPU inputs get GPU arrays, host inputs NumPy arrays."""
        for field in dataclasses.fields(out):
            value = getattr(out, field.name)
            if value is None:
                continue
            if problem.on_gpu and isinstance(value, np.ndarray):
                setattr(out, field.name, self.xp.asarray(value))
            elif not problem.on_gpu and not isinstance(value, np.ndarray):
                setattr(out, field.name, value.get())
        return out

    def gemm(self, handles, A, B, C, *, batch, M, P, K, a_batch=0, a_row=0, a_k=0, b_batch=0,
             b_k=0, b_col=0, block=None, b_block=0, bias=None):
        """C[batch,M,P] = strided A·B (+ bias); see GemmParams in common.metal."""
        params = np.zeros(1, library.GEMM_PARAMS)
        count = batch * M * P
        values = dict(count=count, batch=batch, M=M, P=P, K=K, a_batch=a_batch, a_row=a_row,
                      a_k=a_k, b_batch=b_batch, b_k=b_k, b_col=b_col,
                      block=block or max(M, 1), b_block=b_block, has_bias=int(bias is not None))
        for key, value in values.items():
            params[key] = value
        if count == 0:
            return
        self.launch("strided_gemm", count, handles, p=self.buffer(params), A=A, B=B,
                    bias=bias if bias is not None else self.empty(1), C=C)

    # -- parameters ---------------------------------------------------------------------------
    @staticmethod
    def recurrence_params(problem, count):
        """The RecurrenceParams struct of one call."""
        desc, cell = problem.descriptor, problem.cell
        p = np.zeros(1, library.RECURRENCE_PARAMS)
        acts = [Activation.NONE] * 5
        gates = [0, 0, 0, 0]
        if cell == "single_gate":
            acts[0] = desc.activation
        elif cell == "gru":
            acts[:3] = [desc.update_gate_activation, desc.reset_gate_activation,
                        desc.output_gate_activation]
            gates[:3] = [desc.gate_index[k] for k in "zro"]
            p["reset_after"] = desc.reset_after
            p["flip_z"] = desc.flip_z
        else:
            acts = [desc.input_gate_activation, desc.forget_gate_activation,
                    desc.cell_gate_activation, desc.output_gate_activation, desc.activation]
            gates = [desc.gate_index[k] for k in "ifzo"]
            p["has_peephole"] = problem.peephole is not None
            p["cell_gradient_per_step"] = problem.cell_gradient_per_step
        values = dict(count=count, T=problem.T, N=problem.N, H=problem.H, D=problem.D,
                      G=problem.G, Z=problem.Z, reverse=int(desc.reverse and problem.D == 1),
                      training=int(desc.training), mask_per_step=int(problem.mask_per_step))
        for key, value in values.items():
            p[key] = value
        for k in range(5):
            p[f"act{k}"] = int(acts[k])
        for k in range(4):
            p[f"gate{k}"] = gates[k]
        return p

    def _common(self, problem):
        """Buffers every recurrence reads: h0 (zeros when absent) and the mask (ones)."""
        N, DH = problem.N, problem.D * problem.H
        h0 = problem.init_state if problem.init_state is not None else np.zeros((N, DH), F32)
        mask = problem.mask if problem.mask is not None else np.ones((N, DH), F32)
        return self.buffer(h0), self.buffer(mask)

    # -- forward ------------------------------------------------------------------------------
    def forward(self, problem) -> ForwardArrays:
        T, N, H, D, G, Z = problem.T, problem.N, problem.H, problem.D, problem.G, problem.Z
        cell, desc = problem.cell, problem.descriptor
        DH, DGH = D * H, D * G * H
        wants_c = cell == "lstm" and (desc.training or desc.produce_cell)
        if T == 0 or N == 0:
            empty = np.zeros((T, N, DH), F32)
            return self.to_caller(problem, ForwardArrays(
                empty, empty.copy() if wants_c else None,
                np.zeros((T, N, D * Z * H), F32) if desc.training else None))
        with self._lock:
            handles = []
            source = self.buffer(problem.source)
            if problem.input_weight is not None:
                I = problem.I
                x = self.empty(T * N * DGH)
                bias = self.buffer(problem.bias) if problem.bias is not None else None
                # Wᵀ [I,DGH], so that consecutive threads read consecutive addresses of B.
                Wt = self.buffer(problem.input_weight.T)
                self.gemm(handles, source, Wt, x, batch=1, M=T * N, P=DGH, K=I, a_row=I, a_k=1,
                          b_k=DGH, b_col=1, bias=bias)
                x_bias = self.buffer(np.zeros(DGH, F32))
            else:
                x = source
                x_bias = self.buffer(problem.bias if problem.bias is not None else np.zeros(DGH, F32))
            h0, mask = self._common(problem)
            Rt = self.buffer(problem.recurrent_weight.transpose(0, 2, 1))  # [D,H,GH]
            count = D * N * H
            p = self.buffer(self.recurrence_params(problem, count))
            h = self.empty(T * N * DH)
            keeps_z = desc.training or cell == "gru"  # GRU stages a_r in z_state
            zs = self.empty(T * N * D * Z * H) if keeps_z else self.empty(1)
            if cell == "single_gate":
                self.launch("single_gate_forward", count, handles, p=p, x=x, bias=x_bias, Rt=Rt,
                            h0=h0, mask=mask, h=h, zs=zs)
            elif cell == "gru":
                b2 = problem.secondary_bias if problem.secondary_bias is not None else np.zeros(DH, F32)
                self.launch("gru_forward", count, handles, p=p, x=x, bias=x_bias, Rt=Rt, h0=h0,
                            mask=mask, b2=self.buffer(b2), h=h, zs=zs)
            else:
                c0 = problem.init_cell if problem.init_cell is not None else np.zeros((N, DH), F32)
                peephole = problem.peephole if problem.peephole is not None else np.zeros((D, 4 * H), F32)
                c = self.empty(T * N * DH)
                self.launch("lstm_forward", count, handles, p=p, x=x, bias=x_bias, Rt=Rt, h0=h0,
                            c0=self.buffer(c0), mask=mask, peephole=self.buffer(peephole), h=h,
                            c=c, zs=zs)
            self.finish(handles)
            out = ForwardArrays(self.read(h, (T, N, DH)))
            if wants_c:
                out.c = self.read(c, (T, N, DH))
            if desc.training:
                out.z_state = self.read(zs, (T, N, D * Z * H))
            return self.to_caller(problem, out)

    # -- gradients ----------------------------------------------------------------------------
    def gradients(self, problem) -> GradientArrays:
        T, N, H, D, G = problem.T, problem.N, problem.H, problem.D, problem.G
        cell, desc = problem.cell, problem.descriptor
        DH, GH, DGH = D * H, G * H, D * G * H
        if T == 0 or N == 0:
            return self.to_caller(problem, self._trivial_gradients(problem))
        with self._lock:
            handles = []
            h0, mask = self._common(problem)
            R = self.buffer(problem.recurrent_weight)  # [D,GH,H]
            count = D * N * H
            p = self.buffer(self.recurrence_params(problem, count))
            dy = self.buffer(problem.source_gradient)
            zs = self.buffer(problem.z_state)
            sg = problem.state_gradient if problem.state_gradient is not None else np.zeros((N, DH), F32)
            dhn = self.buffer(sg)
            dx = self.empty(T * N * DGH)
            lhs = dx  # the left factor of dR: da, except GRU's o block with reset_after
            # rhs: h[t−1] ⊙ m per direction; GRU without reset_after adds blocks so that its o
            # gate reads h[t−1] ⊙ r ⊙ m: [hm, hm, hm ⊙ r].
            rhs_blocks = 3 if (cell == "gru" and not desc.reset_after) else 1
            rhs = self.empty(T * N * D * rhs_blocks * H)
            prow = None
            if cell == "single_gate":
                self.launch("single_gate_backward", count, handles, p=p, R=R, h0=h0, mask=mask,
                            dy=dy, zs=zs, dx=dx, rhs=rhs, dhn=dhn)
            elif cell == "gru":
                lhs = self.empty(T * N * DGH)
                prow = self.buffer(np.zeros((D * N, H), F32))
                self.launch("gru_backward", count, handles, p=p, R=R, h0=h0, mask=mask, dy=dy,
                            zs=zs, hfwd=self.buffer(problem.output_fwd), dx=dx, lhs=lhs, rhs=rhs,
                            dhn=dhn, work=self.empty(D * N * H), prow=prow)
            else:
                c0 = problem.init_cell if problem.init_cell is not None else np.zeros((N, DH), F32)
                peephole = problem.peephole if problem.peephole is not None else np.zeros((D, 4 * H), F32)
                cg = problem.cell_gradient
                dc_final = cg if (cg is not None and cg.ndim == 2) else np.zeros((N, DH), F32)
                dcn = self.buffer(dc_final)
                prow = self.buffer(np.zeros((D * N, 4 * H), F32))
                self.launch("lstm_backward", count, handles, p=p, R=R, h0=h0, c0=self.buffer(c0),
                            mask=mask, peephole=self.buffer(peephole), dy=dy, zs=zs,
                            cfwd=self.buffer(problem.cell_output_fwd),
                            cg=self.buffer(cg) if problem.cell_gradient_per_step else self.empty(1),
                            dx=dx, rhs=rhs, dhn=dhn, dcn=dcn, prow=prow)
            rows = T * N
            dR = self.empty(D * GH * H)
            self.gemm(handles, lhs, rhs, dR, batch=D, M=GH, P=H, K=rows, a_batch=GH, a_row=1,
                      a_k=DGH, b_batch=rhs_blocks * H, b_k=D * rhs_blocks * H, b_col=1, block=H,
                      b_block=H if rhs_blocks == 3 else 0)
            ones = self.buffer(np.ones(1, F32))
            bufs = {"recurrent_weight": (dR, (D, GH, H))}
            if problem.input_weight is not None:
                I = problem.I
                W = self.buffer(problem.input_weight)
                d_source = self.empty(rows * I)
                self.gemm(handles, dx, W, d_source, batch=1, M=rows, P=I, K=DGH, a_row=DGH,
                          a_k=1, b_k=I, b_col=1)
                dW = self.empty(DGH * I)
                self.gemm(handles, dx, self.buffer(problem.source), dW, batch=1, M=DGH, P=I,
                          K=rows, a_row=1, a_k=DGH, b_k=I, b_col=1)
                bufs["source"] = (d_source, (T, N, I))
                bufs["input_weight"] = (dW, (DGH, I))
            else:
                bufs["source"] = (dx, (T, N, DGH))
            if problem.bias is not None:
                db = self.empty(DGH)
                self.gemm(handles, ones, dx, db, batch=1, M=1, P=DGH, K=rows, b_k=DGH, b_col=1)
                bufs["bias"] = (db, (1, 1, DGH))
            if problem.init_state is not None:
                bufs["init_state"] = (dhn, (N, DH))
            if cell == "lstm" and problem.init_cell is not None:
                bufs["init_cell"] = (dcn, (N, DH))
            if cell == "lstm" and problem.peephole is not None:
                dp = self.empty(D * 4 * H)
                self.gemm(handles, ones, prow, dp, batch=D, M=1, P=4 * H, K=N, b_batch=N * 4 * H,
                          b_k=4 * H, b_col=1)
                bufs["peephole"] = (dp, (D, 4 * H))
            if cell == "gru" and problem.secondary_bias is not None:
                db2 = self.empty(DH)
                self.gemm(handles, ones, prow, db2, batch=D, M=1, P=H, K=N, b_batch=N * H, b_k=H,
                          b_col=1)
                bufs["secondary_bias"] = (db2, (DH,))
            self.finish(handles)
            out = GradientArrays(**{k: self.read(b, shape) for k, (b, shape) in bufs.items()})
            return self.to_caller(problem, out)

    @staticmethod
    def _trivial_gradients(problem):
        """T = 0 or N = 0: nothing flows through the recurrence (contract section 4)."""
        N, H, D, G = problem.N, problem.H, problem.D, problem.G
        DH, DGH = D * H, D * G * H
        zeros = lambda *shape: np.zeros(shape, F32)  # noqa: E731
        out = GradientArrays(source=zeros(*problem.source.shape),
                             recurrent_weight=zeros(D, G * H, H))
        if problem.input_weight is not None:
            out.input_weight = zeros(DGH, problem.I)
        if problem.bias is not None:
            out.bias = zeros(1, 1, DGH)
        if problem.init_state is not None:
            sg = problem.state_gradient
            out.init_state = _f32(sg) if sg is not None else zeros(N, DH)
        if problem.init_cell is not None:
            cg = problem.cell_gradient
            final = cg is not None and cg.ndim == 2
            out.init_cell = _f32(cg) if final else zeros(N, DH)
        if problem.peephole is not None:
            out.peephole = zeros(D, 4 * H)
        if problem.secondary_bias is not None:
            out.secondary_bias = zeros(DH)
        return out

    # -- the registry's view ------------------------------------------------------------------
    def implementations(self):
        impl = {}
        for cell in registry.CELLS:
            impl[(cell, "forward")] = self.forward
            impl[(cell, "gradients")] = self.gradients
        return impl


# -- the two devices ------------------------------------------------------------------------------

def _metal_device():
    import metalcompute

    return metalcompute.Device()


def _probe_metal():
    try:
        import metalcompute  # noqa: F401
    except ImportError as exc:
        return f"metalcompute does not import ({exc}); it needs macOS on Apple silicon"
    try:
        HOST.device
    except Exception as exc:  # metalcompute.error, or no device
        return f"metalcompute imports but no Metal device was found ({exc})"
    return None


def _emulator_device():
    from .harness import cpu as emulator

    return emulator.Device()


def _probe_emulated():
    try:
        from .harness import cpu as emulator  # noqa: F401
    except ImportError as exc:
        return f"the Metal execution harness does not import ({exc})"
    try:
        emulator._loader.compiler()
    except Exception as exc:  # the harness names what to install
        return f"the Metal execution harness has no C++ compiler ({exc})"
    return None


def _cuda_device():
    from .harness import cuda

    return cuda.Device()


def _probe_cuda():
    try:
        from .harness import cuda
    except ImportError as exc:
        return f"the harness's CUDA target does not import ({exc})"
    reason = cuda.available()
    if reason:
        return reason
    try:
        CUDA_HOST.function("strided_gemm")  # compiles the library once: NVRTC must work
    except Exception as exc:
        return f"the Metal kernels do not compile for this GPU ({type(exc).__name__}: {exc})"
    return None


HOST = MetalHost(_metal_device, "metal")
EMULATED_HOST = MetalHost(_emulator_device, "metal-emulated")
CUDA_HOST = MetalHost(_cuda_device, "metal-cuda")

BACKEND = registry.Backend(
    name="metal",
    dtypes=(np.dtype(F32),),
    implementations=HOST.implementations(),
    probe=_probe_metal,
    summary="hand-written MSL kernels on the Apple GPU through metalcompute (float32)",
)

EMULATED_BACKEND = registry.Backend(
    name="metal-emulated",
    dtypes=(np.dtype(F32),),
    implementations=EMULATED_HOST.implementations(),
    probe=_probe_emulated,
    summary="the Metal kernels on the CPU execution harness (float32; for testing, slow)",
)


CUDA_BACKEND = registry.Backend(
    name="metal-cuda",
    dtypes=(np.dtype(F32),),
    implementations=CUDA_HOST.implementations(),
    probe=_probe_cuda,
    summary="the Metal kernels on an NVIDIA GPU through the harness's CUDA target (float32)",
    gpu=True,
)


@contextlib.contextmanager
def _running_on(host, device):
    previous = host._device, host._functions
    host.use(device)
    try:
        yield device
    finally:
        host._device, host._functions = previous


def emulated_device(**options):
    """Run ``"metal-emulated"`` on ``rnngrad.backends.metal.harness.cpu.Device(**options)`` inside
    the block (for example ``schedule="adversarial", seed=3, max_threads_per_threadgroup=64``);
    yields the device, whose ``trace`` lists the dispatches."""
    from .harness import cpu as emulator

    return _running_on(EMULATED_HOST, emulator.Device(**options))


def cuda_device(**options):
    """Run ``"metal-cuda"`` on ``rnngrad.backends.metal.harness.cuda.Device(**options)`` inside
    the block (for example ``fast_math=True``, ``check_each_dispatch=True``,
    ``max_threads_per_threadgroup=64``); yields the device, whose ``trace`` lists the dispatches
    with their GPU times."""
    from .harness import cuda

    return _running_on(CUDA_HOST, cuda.Device(**options))
