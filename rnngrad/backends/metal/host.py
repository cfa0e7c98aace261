"""The Metal host: runs the kernels of ``kernels/`` on one device that speaks metalcompute's API.

Four backends share this code and differ only in the device they are given
(:mod:`rnngrad.backends.metal.backends` registers them): ``"metal"`` (an Apple GPU through
metalcompute), ``"metal-emulated"`` (the CPU target of the test harness), ``"metal-cuda"`` (an
NVIDIA GPU through :mod:`rnngrad.backends.metal.cuda`) and ``"metal-mps"`` (PyTorch's ``"mps"``
tensors through :mod:`rnngrad.backends.metal.mps`). What a device must and may offer is written
down in :mod:`rnngrad.backends.metal.device`; the host asks for the optional parts with
``getattr`` and does without them.

An op runs in four steps, each in a module of its own:

- **the plan** (:mod:`.schedule`, :mod:`.gemm`, :mod:`.plan`): everything but the arrays follows
  from the problem's signature (sizes, descriptor, which optional inputs are given), the work
  budget and the version rules (:mod:`.versions`). The host decides it once, on an op's first
  call of a signature, keeps :data:`PLANS_KEPT` plans per device, and logs the version choices
  (DEBUG) when a plan is made;
- **binding**: the call's arrays, each new buffer and kept constant. Read-only constants (zeros,
  ones, parameter structs) are made once per device and kept (:meth:`MetalHost.buffer`), on the
  device itself where it can fill memory, so that from the second call of a shape on an op copies
  to the device only the arrays its caller passed. An array already in GPU memory that the
  kernels only read is bound where it is (:meth:`MetalHost.read_only`): only the inputs a kernel
  writes (state_gradient, a final cell_gradient) and the weights read transposed are copied;
- **dispatch**: where the device's functions have ``prepare``, each dispatch of a plan is
  prepared once (:meth:`MetalHost.prepared`): the kept buffers bound, the call's arrays, new
  buffers and status buffer left open, so that a call binds only the open slots (on a device
  that slices, as ``(buffer, byte offset)`` pairs without a view of each);
- **completion** (:mod:`.completion`): every threadgroup's completion mark checked before a
  result is returned; an unfinished dispatch raises
  :class:`~rnngrad.backends.metal.IncompleteDispatch`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import threading

import numpy as np

from ...problem import ForwardArrays, GradientArrays, address, on_gpu
from . import completion, library, schedule, versions
from .errors import IncompleteDispatch
from .mps.tensors import TensorArray
from .layout import Layout
from .plan import INPUT, KEPT, NEW, Constant, Plan, signature

F32 = np.float32
#: where the host logs what it decides (DEBUG) and a v2 entry a device declined (WARNING)
_LOG = logging.getLogger(__package__)
#: read-only constant buffers (zeros, ones, parameter structs) a host keeps per device, least
#: recently used dropped first
CONSTANTS_KEPT = 256
#: alignment in bytes of a caller's GPU array bound in place (read_only): the float4 reads of
#: rg_dots (kernels/v2_rows.metal) need 16; any other address is copied to a new buffer
BIND_ALIGN = 16
#: op plans a host keeps (see MetalHost.plan), least recently used dropped first
PLANS_KEPT = 64
#: descriptions of the newest ops whose marks the device checks after they return (see
#: MetalHost.remember); those captured into a CUDA graph are all kept
DESCRIBED_KEPT = 4096


class MetalHost:
    """Runs rnngrad's kernels on one device (:class:`rnngrad.backends.metal.device.Device`).

    ``device_factory`` makes the device on first use (metalcompute's, a harness target's, the
    CUDA target's or the MPS one); nothing else differs between them.
    """

    def __init__(self, device_factory, name: str):
        self._factory = device_factory
        self.name = name
        self._device = None
        self._functions = {}
        self._constants = collections.OrderedDict()  # key -> read-only buffer (see buffer)
        self._plans = collections.OrderedDict()  # (signature, budget, settings) -> Plan
        self._lock = threading.Lock()
        #: v2 entry point -> the threadgroup size this device gave it, where it declined that
        #: size (see versions): the rule runs v1 for it from then on
        self.declined = {}
        self._device_lock = threading.Lock()
        #: work budget of one recurrence dispatch in units; None: $RNNGRAD_METAL_DISPATCH_BUDGET,
        #: else DISPATCH_BUDGET (module docstring)
        self.dispatch_budget = None
        #: ops whose marks the device checks after they return, by serial: (op, sizes, runs)
        self._serial = 0
        self._described = collections.OrderedDict()
        self._captured = {}

    # -- device and kernels -------------------------------------------------------------------
    @property
    def device(self):
        """The one device of this host, made on first use (one per process: metalcompute keeps
        every device's runs in one table)."""
        if self._device is None:
            with self._device_lock:
                if self._device is None:
                    self._device = self._factory()
        return self._device

    def budget(self) -> int:
        """The work budget of one recurrence dispatch, in units."""
        if self.dispatch_budget is not None:
            value, source = self.dispatch_budget, "dispatch_budget"
        else:
            value = os.environ.get(schedule.BUDGET_ENV, "").strip() or schedule.DISPATCH_BUDGET
            source = schedule.BUDGET_ENV
        try:
            budget = int(str(value).replace("_", ""), 0)
        except ValueError:
            budget = 0
        if budget < 1:
            raise ValueError(f"{source}: expected a positive integer (work units per dispatch), "
                             f"got {value!r}")
        return budget

    def step_ranges(self, problem) -> list:
        """[(s_begin, s_end)] of the recurrence dispatches of ``problem``, in processing order."""
        return schedule.step_ranges(problem.T, schedule.step_units(problem), self.budget())

    def use(self, device):
        """Run on ``device`` from now on (its kernels are compiled again on first use, its
        constant buffers made again)."""
        self._device = device
        self._functions = {}
        self._constants = collections.OrderedDict()
        self._plans = collections.OrderedDict()
        self.declined = {}

    @contextlib.contextmanager
    def using(self, device):
        """Run on ``device`` inside the block, then on the device (kernels, kept buffers, plans,
        declined entries) this host had before; yields ``device``."""
        with self._lock:
            before = (self._device, self._functions, self._constants, self._plans, self.declined)
            self.use(device)
        try:
            yield device
        finally:
            with self._lock:
                (self._device, self._functions, self._constants, self._plans,
                 self.declined) = before

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
        """A device buffer holding a copy of ``array`` (float32 unless it is a params struct).

        Read-only constants are made once per device and kept (:data:`CONSTANTS_KEPT` of them,
        least recently used dropped first): a :class:`Constant`, made on the device where it can
        fill memory itself, and a params struct, kept by its bytes (every kernel's ``p`` is
        ``constant``). A buffer a kernel writes must be new each call: a plan's new buffer
        (:meth:`Plan.empty <rnngrad.backends.metal.plan.Plan.empty>`, ``Plan.zeroed``: each
        call makes its own), or a copy of an array."""
        if isinstance(array, Constant):
            n, value = max(int(array.n), 1), float(array.value)
            return self._kept(("fill", value, n), lambda: self.filled(n, value))
        if on_gpu(array):  # already on the GPU: copied there
            xp = self.xp
            if not array.size:
                return self.device.buffer(xp.zeros(1, F32))
            wrap = getattr(self.device, "wrap", None)
            if wrap is None or (array.dtype == F32 and array.flags.c_contiguous):
                return self.device.buffer(xp.ascontiguousarray(array, dtype=F32))
            # Another layout or dtype: the conversion is a new array, the op's own (one copy),
            # made by wrap for a float32 array in another layout (Rᵀ: its copy is one kernel).
            return wrap(array if array.dtype == F32 else xp.ascontiguousarray(array, dtype=F32))
        array = np.ascontiguousarray(array)
        if array.dtype.names is not None:  # a params struct: plain bytes for metalcompute
            return self.params(array.dtype, tuple(array.reshape(-1)[0].tolist()))
        array = array.astype(F32, copy=False)
        if array.nbytes == 0:
            array = np.zeros(1, F32)  # Metal has no empty buffers; never read
        return self.device.buffer(array)

    def read_only(self, array):
        """A device buffer of ``array`` for kernels that only read it (``const device`` in every
        kernel it is bound to): a GPU array already C-contiguous float32 is bound in place where
        the device can bind one without a copy (``device.wrap``: the CUDA target); anything else,
        a :class:`Constant` included, as :meth:`buffer` makes it: an array at an address off
        :data:`BIND_ALIGN` too (a slice may start anywhere; kernels read some inputs as float4).
        Never for a buffer a kernel writes (the caller's array would change)."""
        if (on_gpu(array) and array.dtype == F32 and array.flags.c_contiguous and array.size
                and address(array) % BIND_ALIGN == 0):
            wrap = getattr(self.device, "wrap", None)
            if wrap is not None:
                return wrap(array)
        return self.buffer(array)

    def params(self, struct, values):
        """The device buffer of a parameter struct (``library.GEMM_PARAMS`` or
        ``RECURRENCE_PARAMS``) holding ``values`` (a tuple in field order), kept as
        :meth:`buffer` keeps a struct, without building the struct when it is kept; made by
        ``device.constant`` where the device has it (the CUDA target: the launch takes the bytes
        by value)."""
        make = getattr(self.device, "constant", None) or self.device.buffer
        return self._kept(("params", struct, values),
                          lambda: make(np.array([values], struct).view(np.uint8)))

    def _kept(self, key, make):
        """The constant buffer under ``key``, made by ``make()`` when not kept (LRU), in the
        device's own memory where a caller's allocator may be current (``device.persistent``:
        it outlives the op)."""
        kept = self._constants
        if key in kept:
            kept.move_to_end(key)
            return kept[key]
        persistent = getattr(self.device, "persistent", None)
        with persistent() if persistent is not None else contextlib.nullcontext():
            buf = kept[key] = make()
        while len(kept) > CONSTANTS_KEPT:
            kept.popitem(last=False)
        return buf

    def filled(self, n, value):
        """A new device buffer of ``n`` float32 elements equal to ``value``: filled on the device
        where it can (``device.zeros``, ``device.full``: the CUDA target), else copied from the
        host, since metalcompute does not zero new buffers."""
        make = getattr(self.device, "zeros" if value == 0 else "full", None)
        if make is None:
            return self.device.buffer(np.full(n, value, F32))
        return make(4 * n) if value == 0 else make(n, value)

    # -- completion checked after the op returned (completion.Runs.wait) ------------------------
    def remember(self, op: str, sizes: dict, dispatches: list) -> int:
        """A serial number for an op whose marks the device checks after it returns, and its
        description kept under it (the newest :data:`DESCRIBED_KEPT`, and every one captured
        into a CUDA graph, whose replays report it): ``dispatches``, per dispatch, its kernel,
        count, span and number (``Layout.described``)."""
        self._serial += 1
        entry = (op, sizes, dispatches)
        capturing = getattr(self.device, "capturing", None)
        if capturing is not None and capturing():
            self._captured[self._serial] = entry
        else:
            described = self._described
            described[self._serial] = entry
            if len(described) > DESCRIBED_KEPT:
                described.popitem(last=False)
        return self._serial

    def check_late(self, wait: bool = False) -> None:
        """Raise :class:`~rnngrad.backends.metal.IncompleteDispatch` for an op that returned
        before its marks were checked and that the device has since found unfinished; with
        ``wait``, wait for the device first (``rnngrad.synchronize()``), so every op issued
        before is checked."""
        device = self._device
        fault = getattr(device, "fault", None)
        if fault is None:
            return
        if wait:
            device.synchronize()
        found = fault()
        if found is None:
            return
        device.clear_fault()
        raise self._late(*found)

    def _late(self, serial, row, group, word, reported=None) -> IncompleteDispatch:
        entry = self._described.get(serial) or self._captured.get(serial)
        if entry is None:
            return IncompleteDispatch(
                f"an op on {self.name} (serial {serial}, no longer described) did not finish on "
                f"the device, detected after it returned; its outputs, and anything computed "
                f"from them since, are not to be trusted", kernel="", op="", sizes={},
                dispatch=row, steps=None, missing=(group,), reported=None, late=True)
        op, sizes, runs = entry
        run = runs[row]
        what = (f"reported: {reported}" if reported
                else "declined this device's threadgroups" if word == library.DECLINED
                else f"left no completion mark from threadgroup {group}" if word == 0
                else f"left a wrong mark (0x{word:08x}) from threadgroup {group}")
        size = ", ".join(f"{k}={v}" for k, v in sizes.items() if v is not None)
        return IncompleteDispatch(
            f"{op}: kernel {run['kernel']} did not finish on the device (dispatch "
            f"{run['number']} of the op, counting from 0; {run['count']} threads; problem "
            f"{size}): it {what}. Detected after the op had returned, at a later rnngrad call on "
            f"{self.name}, rnngrad.synchronize() or exit: its outputs, and anything computed from "
            f"them since, are not to be trusted. Set {completion.LAUNCH_BLOCKING_ENV}=1 to "
            f"check each op before it returns.", kernel=run["kernel"], op=op, sizes=sizes,
            dispatch=run["number"], steps=run["span"], missing=() if reported else (group,),
            reported=reported, late=True)

    def synchronize(self) -> None:
        """Wait for the device, if this host has made one, and raise for any op found
        unfinished (:meth:`check_late`)."""
        if self._device is not None:
            self.check_late(wait=True)

    def read(self, buf, shape):
        """The first prod(shape) floats of a buffer the op made: a NumPy copy, or on the CUDA
        target a CuPy view (the buffer is the op's own)."""
        n, xp = math.prod(shape), self.xp
        offset = 0
        if type(buf) is tuple:  # (buffer, byte offset): see completion.Runs.pairs
            buf, offset = buf
        if xp is np:
            return np.frombuffer(buf, F32, count=n, offset=offset).reshape(shape).copy()
        return buf.view(xp.float32)[offset // 4:offset // 4 + n].reshape(shape)

    def words(self, buf, n):
        """The first ``n`` uint32 words of a buffer, as a NumPy copy (from the GPU too)."""
        xp = self.xp
        if xp is np:
            return np.frombuffer(buf, np.uint32, count=n).copy()
        return self._to_host(buf.view(xp.uint32)[:n])

    def _to_host(self, a):
        """A NumPy copy of device array ``a``: a CuPy array's ``get``, else the array module's
        ``asnumpy`` (a tensor's: rnngrad.tensors)."""
        return a.get() if hasattr(a, "get") else self.xp.asnumpy(a)

    def to_caller(self, problem, out):
        """Results where the inputs were: GPU inputs get GPU arrays (tensors for tensors:
        rnngrad.tensors), host inputs NumPy arrays."""
        gpu = problem.on_gpu
        for field in dataclasses.fields(out):
            value = getattr(out, field.name)
            if value is None:
                continue
            if gpu and (isinstance(value, np.ndarray) or type(value) is TensorArray):
                setattr(out, field.name, self.xp.asarray(value))
            elif not gpu and not isinstance(value, np.ndarray):
                setattr(out, field.name, self._to_host(value))
        return out

    # -- plans and their calls ----------------------------------------------------------------
    def plan(self, problem) -> Plan:
        """The :class:`~rnngrad.backends.metal.plan.Plan` of ``problem``'s op: kept per
        signature, budget, version rules in force and declined entries (:data:`PLANS_KEPT` of
        them, least recently used dropped first), made on first use. Call under the host's
        lock."""
        key = (signature(problem), self.budget(), versions.key(), frozenset(self.declined))
        plans = self._plans
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        make = schedule.gradients_plan if problem.gradients else schedule.forward_plan
        plan = make(self, problem)
        refused = self._refused(plan)
        if refused:  # made again without the v2 entries this device would run in other sizes
            for kernel, threads in refused.items():
                self.declined[kernel] = threads
                _LOG.warning("%s: %s runs in threadgroups of %d threads here, not the size the "
                             "rule chose it for; the host runs v1 for it on this device",
                             self.name, kernel, threads)
            return self.plan(problem)
        plans[key] = plan
        while len(plans) > PLANS_KEPT:
            plans.popitem(last=False)
        return plan

    def _refused(self, plan) -> dict:
        """{v2 entry point: the threadgroup size the device's function says it runs in} for the
        v2 dispatches of ``plan`` whose size is not the one the rule chose the entry for; empty
        where the device's functions do not say (metalcompute: the kernels decline at run time,
        :class:`~rnngrad.backends.metal.completion.Declined`)."""
        refused = {}
        for kernel, *_ in plan.launches:
            if "_v2_" not in kernel:
                continue
            size = getattr(self.function(kernel), "threadgroup_size", None)
            want = versions.V2_THREADS_512 if kernel.endswith("_512") else versions.V2_THREADS
            if size is not None and size() != want:
                refused[kernel] = size()
        return refused

    def _call(self, problem) -> dict:
        """Run ``problem``'s op by its plan (:meth:`_run`); where a v2 entry point declines the
        device's threadgroups, note it in :attr:`declined` and run the op again, by a plan that
        runs v1 for it."""
        with self._lock:
            self.check_late()  # an earlier op found unfinished since it returned
            while True:
                try:
                    return self._run(problem)
                except completion.Declined as declined:
                    if declined.kernel in self.declined:
                        raise RuntimeError(f"{declined}, again: the rule chose it although it "
                                           f"had declined") from None
                    self.declined[declined.kernel] = declined.threads
                    _LOG.warning("%s: %s; the host runs v1 for it on this device", self.name,
                                 declined)

    def _run(self, problem) -> dict:
        """Run ``problem``'s op by its plan: bind the call's inputs and the new buffers of its
        layout (:meth:`layout`), dispatch, wait and check; the outputs by field (see
        :meth:`read`). Call under the host's lock."""
        plan = self.plan(problem)
        prepared = self.prepared(plan)
        # the new buffers results are read from get allocations of their own where results must
        # not share memory (a PyTorch operator's outputs alias neither each other: metal-mps's
        # tensors; a caller's allocator knows each of its allocations)
        layout = self.layout(plan, prepared, getattr(self.device, "results_apart", False))
        with completion.Runs(self, plan.op, problem, layout, prepared is not None) as runs:
            kept, inputs = plan.kept, [None] * len(plan.inputs)

            def buffer(kind, i):
                if kind == KEPT:
                    return kept[i]
                if kind == INPUT:
                    if inputs[i] is None:
                        field, axes, written = plan.inputs[i]
                        array = getattr(problem, field)
                        if axes is not None:
                            array = array.transpose(axes)
                        inputs[i] = self.buffer(array) if written else self.read_only(array)
                    return inputs[i]
                return runs.new(i)

            # a prepared dispatch has its kept buffers bound already: only its open slots
            calls = prepared or [(None, launch[4]) for launch in plan.launches]
            for number, (call, slots) in enumerate(calls):
                runs.launch(number, [buffer(k, i) for k, i in slots], call)
            runs.wait()  # waits for the GPU and checks every dispatch's marks
            return {field: self.read(buffer(*slot), shape)
                    for field, slot, shape in plan.outputs}

    def layout(self, plan, prepared, apart: bool) -> Layout:
        """The :class:`~rnngrad.backends.metal.layout.Layout` of a call of ``plan`` on this
        host's device, made once per plan (and per ``apart``: results in allocations of their
        own); its marks counted in each dispatch's threadgroup size where the device says it
        (the prepared call's, the function's ``threadgroup_size``), else in threadgroups of
        ``library.MIN_THREADGROUP`` (metalcompute picks the size at the call)."""
        layout = plan.layouts.get(apart)
        if layout is None:
            if prepared:
                sizes = [call.tg for call, _ in prepared]
            else:
                sizes = []
                for kernel, *_ in plan.launches:
                    size = getattr(self.function(kernel), "threadgroup_size", None)
                    sizes.append(size() if size is not None else library.MIN_THREADGROUP)
            own = frozenset(i for _, (kind, i), _ in plan.outputs if kind == NEW) if apart \
                else frozenset()
            layout = plan.layouts[apart] = Layout(
                plan, [max(size, library.MIN_THREADGROUP) for size in sizes],
                completion.regions(self.device), own)
        return layout

    def prepared(self, plan):
        """``[(prepared call, open slots)]`` per dispatch of ``plan``: each prepared once on this
        host's device with its kept buffers (constants, parameter structs) bound and its other
        slots and the status buffer open (the device's ``Function.prepare``), kept in the plan;
        None where the device's functions do not prepare (metalcompute), whose calls bind every
        buffer each time. Call under the host's lock."""
        if plan.prepared is None:
            calls = []
            for kernel, count, _, _, slots in plan.launches:
                prepare = getattr(self.function(kernel), "prepare", None)
                if prepare is None:
                    calls = False
                    break
                fixed = [plan.kept[i] if kind == KEPT else None for kind, i in slots]
                calls.append((prepare(count, *fixed, None),
                              tuple(slot for slot in slots if slot[0] != KEPT)))
            plan.prepared = calls
        return plan.prepared or None

    # -- forward ------------------------------------------------------------------------------
    def forward(self, problem) -> ForwardArrays:
        """``problem``'s forward op (a validated :class:`rnngrad.problem.Problem`)."""
        if problem.T == 0 or problem.N == 0:
            return self.to_caller(problem, schedule.trivial_forward(problem))
        return self.to_caller(problem, ForwardArrays(**self._call(problem)))

    def gradients(self, problem) -> GradientArrays:
        """``problem``'s gradient op (a validated :class:`rnngrad.problem.Problem`)."""
        if problem.T == 0 or problem.N == 0:
            return self.to_caller(problem, schedule.trivial_gradients(problem))
        return self.to_caller(problem, GradientArrays(**self._call(problem)))
