"""A stand-in for ``torch.mps.compile_shader`` on the harness: the ``metal-mps`` path without a Mac.

PyTorch (2.7 and later) compiles Metal source at run time on a Mac; each kernel of the source
is then a callable that encodes one dispatch into PyTorch's own MPS command stream::

    lib = torch.mps.compile_shader(source)
    lib.fill(out, 3.14, 7, threads=n, group_size=64)   # returns None
    torch.mps.synchronize()                          # waits for it

:class:`StandIn` presents that API on the harness: ``StandIn("cpu")`` compiles through the CPU
target and takes CPU tensors, ``StandIn("cuda")`` through the CUDA target and takes CUDA
tensors. What the real API does, as PyTorch's source has it (``torch/csrc/mps/Module.cpp``,
``aten/src/ATen/native/mps/MetalShaderLibrary.mm``), and the stand-in with it:

- ``lib.<name>`` is the kernel of that name, a ``RuntimeError`` for a name the source lacks;
  ``dir(lib)`` lists the kernels. A kernel has ``max_threads_per_threadgroup`` (its pipeline's
  limit), ``thread_execution_width`` and ``static_thread_group_memory_length``.
- ``kernel(*args, threads=None, group_size=None, arg_casts=None)``: argument ``i`` binds
  ``[[buffer(i)]]``. A tensor binds its storage from its storage offset (``offset =
  storage_offset · element_size``); its strides are not looked at, so a non-contiguous tensor
  is read as the storage it views, from its first element. A Python ``float`` binds as
  ``constant float&`` (4 bytes), an ``int`` (and a ``bool``) as ``constant long&`` (8 bytes);
  a list or tuple of ints as ``constant long*``, of floats as ``constant float*``, of tensors
  as an array of their addresses. ``arg_casts`` (a name for every scalar, or ``{index:
  name}``) narrows scalars: ``"fp16"``, ``"bf16"``, ``"int32"``, ``"int16"``, ``"int8"``,
  ``"uint8"``.
- ``threads``: the total number of threads (``dispatchThreads``), an int or a list of one to
  three ints; by default the element count of the first tensor argument. ``group_size``: the
  threads of a threadgroup, by default ``min(threads, max_threads_per_threadgroup)``; above
  that limit a ``ValueError`` ("Threadgroup size exceeds …"). ``group_size`` need not be a
  multiple of the SIMD width (32): a threadgroup then ends in a short SIMD-group. A grid that
  is not a whole number of threadgroups ends in a partial threadgroup of ``threads %
  group_size`` threads: threads past ``threads`` do not exist (they do not run, nor take part
  in barriers or SIMD collectives), and in the partial threadgroup
  ``[[threads_per_threadgroup]]``, ``[[simdgroups_per_threadgroup]]`` and, in its last
  SIMD-group, ``[[threads_per_simdgroup]]`` are the actual, smaller sizes;
  ``[[threads_per_grid]]`` is ``threads``. The stand-in runs both so on the CPU target
  (collectives among the lanes that exist; one that reads a lane that does not exist gets NaN
  bytes, a value Metal leaves undefined).
- The dispatch is encoded on PyTorch's current MPS stream, after the work queued there before;
  ``torch.mps.synchronize()`` (or reading a result) waits for it. Nothing is reported back:
  the call returns None, and no command buffer status reaches the caller.

What the stand-in does not do (each refused with an error that says so, never run otherwise):

- **partial threadgroups and short SIMD-groups on the CUDA target**: its SIMD collectives are
  warp shuffles over all 32 lanes, so there ``threads`` must be a whole number of
  threadgroups and ``group_size`` a multiple of 32 (the default ``group_size`` too:
  ``threads`` below the limit must then be a multiple of 32); the CPU target runs both;
- **2-D and 3-D grids**: ``threads`` of more than one axis must have the others 1;
- ``[[threadgroup(i)]]`` arguments fail to compile here (the harness's translation refuses
  them); on a Mac they compile, but the API has no way to give them a length;
- 0-dimensional CPU tensors as scalars (the real API binds them as bytes) are not taken.

The stand-in cannot show Apple's compiler (it compiles as C++ or CUDA), Apple's scheduling
(threadgroup order, SIMD-group interleaving, the GPU watchdog) or anything about speed on a
Mac. Its dispatches run on the harness device :attr:`StandIn.harness` (made with the options
given, so ``StandIn("cpu", stop=(3, 1))`` stops dispatch 3 after one threadgroup, as the CPU
harness's failure injection does); its ``trace`` lists them. ``StandIn(device, drop=i)`` leaves
call ``i`` out altogether (it never starts), on either target.
"""

from __future__ import annotations

import ctypes
import operator
import weakref

import numpy as np

from ..msl import dispatch

#: the scalar casts ``arg_casts`` names, as NumPy dtypes (bf16: the top half of a float32)
CASTS = {"fp16": np.float16, "bf16": "bf16", "int32": np.int32, "int16": np.int16,
         "int8": np.int8, "uint8": np.uint8}


class StandIn:
    """``torch.mps.compile_shader``'s API (module docstring) on the harness target of
    ``device`` ("cpu": the CPU target, CPU tensors; "cuda": the CUDA target, CUDA tensors).
    ``harness_options`` go to the target's ``Device`` (``stop=``, ``timeout=``,
    ``max_threads_per_threadgroup=`` …). Call it with the source: ``StandIn("cpu")(source)``."""

    def __init__(self, device: str = "cpu", *, drop: int | None = None, **harness_options):
        import torch

        self.torch_device = torch.device(device)
        kind = self.torch_device.type
        if kind == "cuda" and self.torch_device.index is None:  # tensors say "cuda:0"
            self.torch_device = torch.device("cuda", torch.cuda.current_device())
        if kind == "cpu":
            from . import cpu as target
        elif kind == "cuda":
            from .. import cuda as target  # the CUDA target, metal-cuda's device
        else:
            raise ValueError(f"device: expected 'cpu' or 'cuda' (the harness targets), got "
                             f"{device!r}")
        self.target = target
        if kind == "cuda":  # one CUDA event a call, as the metal-cuda backend's own device
            harness_options.setdefault("timing", False)
        self.harness = target.Device(**harness_options)
        #: the harness device's own cap on threadgroups (a pipeline limit, as a Mac's may be)
        self.cap = self.harness.max_threads_per_threadgroup
        self._structs = {}  # id(tensor) -> (weakref, version, bytes): see _struct
        if drop is not None and not (isinstance(drop, int) and drop >= 0):
            raise ValueError(f"drop: expected a dispatch number, an int >= 0, got {drop!r}")
        #: the number of a dispatch that is left out (never started), as a GPU fault before it
        #: began would leave it; counted from 0 over this stand-in's calls
        self.drop = drop
        #: the calls made so far
        self.calls = 0

    def __repr__(self):
        return f"StandIn({str(self.torch_device)!r}, {self.harness!r})"

    @property
    def trace(self):
        """The harness device's dispatch trace."""
        return self.harness.trace

    def __call__(self, source: str) -> "Library":
        """``torch.mps.compile_shader(source)``."""
        try:
            compiled = self.harness.kernel(source)
        except self.target.error as exc:
            raise RuntimeError(f"Failed to create metal library, error: {exc}") from None
        return Library(self, compiled)

    def _struct(self, tensor, size):
        """The bytes of a tensor bound to a ``constant T&`` the CUDA target takes by value:
        read back once per tensor and version (the kernels never write such a buffer)."""
        kept = self._structs.get(id(tensor))
        if kept is not None and kept[0]() is tensor and kept[1] == tensor._version:
            return kept[2]
        data = tensor.detach().reshape(-1).cpu().numpy().view(np.uint8)[:size].copy()
        if len(self._structs) > 4096:
            self._structs = {k: v for k, v in self._structs.items() if v[0]() is not None}
        self._structs[id(tensor)] = (weakref.ref(tensor), tensor._version, data)
        return data


class Library:
    """A compiled source: each kernel is an attribute (:class:`Kernel`)."""

    def __init__(self, standin: StandIn, compiled):
        self._standin, self._compiled = standin, compiled
        self._kernels = {}

    def __dir__(self):
        return sorted(self._compiled._kernels)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        kernels = self.__dict__["_kernels"]
        if name not in kernels:
            try:
                function = self._compiled.function(name)
            except self._standin.target.error:
                raise RuntimeError(f"Failed to create function state object for: {name}") from None
            kernels[name] = Kernel(self._standin, function)
        return kernels[name]


class Kernel:
    """One kernel of a :class:`Library`: call it as ``kernel(*args, threads=, group_size=)``."""

    thread_execution_width = dispatch.SIMD_WIDTH

    def __init__(self, standin: StandIn, function):
        self._standin, self._function = standin, function
        self.name = function.name

    @property
    def max_threads_per_threadgroup(self) -> int:
        """The pipeline's limit: the kernel's ``max_total_threads_per_threadgroup``, the
        compiled kernel's limit (CUDA: registers) and the harness device's cap, in whole
        SIMD-groups."""
        f = self._function
        return dispatch.threadgroup_size(f.max_total_threads_per_threadgroup,
                                         getattr(f, "_compiled_limit", 1024), self._standin.cap)

    @property
    def static_thread_group_memory_length(self) -> int:
        """Bytes of threadgroup memory the kernel declares (the CUDA target's count; 0 on the
        CPU target, which knows it only once a dispatch ran)."""
        return int(getattr(self._function, "threadgroup_memory", 0))

    def __call__(self, *args, threads=None, group_size=None, arg_casts=None):
        standin = self._standin
        casts = _casts(arg_casts)
        bound, first = [], None
        for i, arg in enumerate(args):
            if _is_tensor(arg):
                if arg.device != standin.torch_device:
                    raise RuntimeError(f"kernel '{self.name}': argument {i} is a tensor on "
                                       f"{arg.device}; this stand-in binds tensors on "
                                       f"{standin.torch_device}")
                if first is None:
                    first = arg.numel()
                bound.append(self._buffer(i, arg))
            else:
                bound.append(_scalar(self.name, i, arg, casts.get(i, casts.get(None)), standin))
        if threads is None:
            if first is None:
                raise RuntimeError("Number of threads is undefined or has wrong dimension")
            threads = first
        threads = _one_axis(self.name, "threads", threads)
        limit = self.max_threads_per_threadgroup
        if group_size is None:
            group = min(threads, limit)
        else:
            group = _one_axis(self.name, "group_size", group_size)
            if group > limit:
                raise ValueError(f"Threadgroup size exceeds {limit} limit")
            if group < 1:
                raise ValueError(f"kernel '{self.name}': group_size: expected a threadgroup "
                                 f"size >= 1, got {group}")
        exact = getattr(self._function, "dispatch_threads", None)  # the CPU target's
        if exact is None and threads and group % dispatch.SIMD_WIDTH:
            raise NotImplementedError(
                f"kernel '{self.name}': group_size {group}: the stand-in on the CUDA target "
                f"runs threadgroups of whole SIMD-groups of {dispatch.SIMD_WIDTH}; a Mac (and "
                f"the stand-in on the CPU target) runs any size up to {limit}")
        if exact is None and threads % max(group, 1):
            raise NotImplementedError(
                f"kernel '{self.name}': threads={threads} is not a whole number of "
                f"threadgroups of {group}: Metal would run a partial last threadgroup of "
                f"{threads % group} threads, which the stand-in runs on the CPU target only; "
                f"on the CUDA target pad threads to a multiple of group_size")
        number, standin.calls = standin.calls, standin.calls + 1
        if number == standin.drop:
            return None
        harness = standin.harness
        try:
            if exact is not None:
                exact(threads, group or limit, *bound)
            else:
                harness.max_threads_per_threadgroup = group if threads else standin.cap
                self._function(threads, *bound)
        except standin.target.error as exc:
            raise RuntimeError(f"kernel '{self.name}' failed: {exc}") from None
        finally:
            harness.max_threads_per_threadgroup = standin.cap
        return None

    def _buffer(self, index, tensor):
        """The target's buffer at the tensor's storage offset (its strides ignored), to the end
        of its storage; for a ``constant T&`` the CUDA target takes by value, its bytes."""
        standin = self._standin
        structs = getattr(self._function, "_structs", {})
        if index in structs:
            return standin._struct(tensor, structs[index])
        itemsize = tensor.element_size()
        nbytes = tensor.untyped_storage().nbytes() - tensor.storage_offset() * itemsize
        address = tensor.data_ptr()
        if standin.torch_device.type == "cpu":
            target = standin.target
            if nbytes <= 0 or not address:  # an empty storage: one byte no kernel reads
                return standin.harness.buffer(1)
            view = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), np.uint8)
            buf = view.view(target.Buffer)
            buf._mc_addr = address
            buf._rnngrad_keep = tensor  # the memory outlives the call
            return buf
        import cupy

        if nbytes <= 0 or not address:
            return cupy.zeros(1, cupy.uint8)
        memory = cupy.cuda.UnownedMemory(address, nbytes, tensor, tensor.device.index)
        return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _casts(arg_casts) -> dict:
    """{index or None (every scalar): cast name}."""
    if arg_casts is None:
        return {}
    if isinstance(arg_casts, str):
        arg_casts = {None: arg_casts}
    elif not isinstance(arg_casts, dict):
        raise RuntimeError(f"Unexpected caster arg type {type(arg_casts).__name__}")
    for name in arg_casts.values():
        if name not in CASTS:
            raise RuntimeError(f"Unsupported cast instruction {name}")
    return dict(arg_casts)


def _cast(values: np.ndarray, cast):
    if cast is None:
        return values
    if CASTS[cast] == "bf16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(CASTS[cast])


def _scalar(kernel, index, arg, cast, standin):
    """The bytes of a scalar or list argument (module docstring), as the harness binds a
    buffer argument that is not one of its buffers: a copy for the call."""
    if isinstance(arg, (list, tuple)):
        if not arg:
            raise RuntimeError("Empty list/tuple can not be an argument to metal kernel")
        if _is_tensor(arg[0]):
            values = np.array([t.data_ptr() for t in arg], np.uint64)
            return values.view(np.uint8)
        if isinstance(arg[0], bool) or isinstance(arg[0], int):
            values = np.array([operator.index(v) for v in arg], np.int64)
        elif isinstance(arg[0], float):
            values = np.array(arg, np.float32)
        else:
            raise RuntimeError("Unexpected argument types")
    elif isinstance(arg, float):
        values = np.array([arg], np.float32)
    elif isinstance(arg, int):  # bool too
        values = np.array([int(arg)], np.int64)
    else:
        raise RuntimeError(f"kernel '{kernel}': argument {index}: Unsupported argument type "
                           f"{type(arg).__name__}")
    return np.ascontiguousarray(_cast(values, cast)).view(np.uint8)


def _one_axis(kernel, name, value) -> int:
    """An int, or a list of one to three ints whose axes past the first are 1 (the harness
    targets run 1-D grids)."""
    if isinstance(value, (list, tuple)):
        if not 0 < len(value) < 4:
            raise RuntimeError("Number of threads is undefined or has wrong dimension")
        if any(operator.index(v) != 1 for v in value[1:]):
            raise NotImplementedError(f"kernel '{kernel}': {name}={tuple(value)}: the stand-in "
                                      f"runs 1-D grids only (the harness targets' rule)")
        value = value[0]
    value = operator.index(value)
    if value < 0:
        raise RuntimeError(f"kernel '{kernel}': {name}: expected a count >= 0, got {value}")
    return value
