"""The CUDA target's own small kernels, in CUDA C (the library's are MSL): the check of an op's
completion marks (``Device.check_marks``) and the transposed copy ``Device.wrap`` makes of a
weight whose last two axes are swapped."""

from __future__ import annotations

import numpy as np


def _cupy():
    import cupy

    return cupy


#: Device.check_marks: every mark word of an op against its table (per dispatch: word offset,
#: marks, threadgroups, threadgroup size, steps); the first wrong word of the first failing op is
#: recorded in fault[1..3] (dispatch, threadgroup, word) and then its serial in fault[0]
_CHECK_SOURCE = r"""
extern "C" __global__ void rnngrad_check_marks(const unsigned int* marks,
                                               const unsigned int* table, unsigned int n,
                                               unsigned long long serial,
                                               unsigned long long* fault) {
    for (unsigned int d = 0; d < n; ++d) {
        const unsigned int* row = table + 5 * d;
        unsigned int offset = row[0], words = 2 * row[1], groups = row[2];
        for (unsigned int w = threadIdx.x; w < words; w += blockDim.x) {
            unsigned int g = w >> 1;
            unsigned int want = g < groups ? ((w & 1u) ? row[3] : (0x80000000u | row[4])) : 0u;
            unsigned int got = marks[offset + w];
            if (got != want && atomicCAS(fault + 4, 0ull, 1ull) == 0ull) {
                fault[1] = d;
                fault[2] = g;
                fault[3] = got;
                __threadfence_system();
                atomicExch(fault, serial);
            }
        }
    }
}
"""

_CHECK = []  # the compiled kernel, made on first use

#: bytes of pinned host memory kept for the check tables first met inside a CUDA graph's capture
HOST_TABLE_BYTES = 1 << 18


class _HostTables:
    """Check tables in pinned host memory, which the check kernel reads in place (unified
    addressing): one is made with no CUDA call, so inside a CUDA graph's capture, where nothing
    can be allocated or copied; each is kept for the process (a graph may replay at any time)."""

    def __init__(self, cp, nbytes: int):
        self._memory = cp.cuda.alloc_pinned_memory(nbytes)
        self._words = np.frombuffer(self._memory, np.uint32, count=nbytes // 4)
        self._offsets = {}  # table bytes -> word offset
        self._used = 0

    def address(self, key: bytes) -> int:
        """The address of the table whose bytes are ``key`` (uint32 words), written once."""
        offset = self._offsets.get(key)
        if offset is None:
            words = np.frombuffer(key, np.uint32)
            if self._used + words.size > self._words.size:
                raise RuntimeError(
                    f"check tables made inside CUDA graph captures: expected at most "
                    f"{self._words.size * 4} bytes in all, got {(self._used + words.size) * 4}; "
                    f"run each captured op once before its capture")
            offset = self._offsets[key] = self._used
            self._words[offset:offset + words.size] = words
            self._used += words.size
        return self._memory.ptr + 4 * offset


def _check_kernel():
    if not _CHECK:
        _CHECK.append(_cupy().RawKernel(_CHECK_SOURCE, "rnngrad_check_marks"))
    return _CHECK[0]


#: out[k, j, i] = a[k, i, j] for a C-contiguous float32 a [batch, rows, cols]: Device.wrap's copy
#: of a view with its last two axes swapped (as the Metal host binds Rᵀ), a grid-stride loop
_TRANSPOSE_SOURCE = r"""
extern "C" __global__ void rnngrad_transpose(const float* a, float* out, unsigned long long batch,
                                             unsigned long long rows, unsigned long long cols) {
    unsigned long long n = batch * rows * cols, plane = rows * cols;
    for (unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; t < n;
         t += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long k = t / plane, r = t % plane, i = r / cols, j = r % cols;
        out[k * plane + j * rows + i] = a[t];
    }
}
"""


def _swaps_last_axes(a) -> bool:
    """Whether ``a`` (a CuPy array) is float32 [.., cols, rows] with its last two axes those of
    a C-contiguous [.., rows, cols] swapped, starting at that array's first element."""
    if a.dtype != np.float32 or a.ndim not in (2, 3) or a.size == 0:
        return False
    cols, rows = a.shape[-2], a.shape[-1]
    return (a.strides[-2] == 4 and a.strides[-1] == 4 * cols
            and (a.ndim == 2 or a.strides[0] == 4 * rows * cols))


_TRANSPOSE = []  # the compiled kernel, made on first use


def _transposed_copy(a):
    """A C-contiguous copy of ``a`` (:func:`_swaps_last_axes`) on the current stream: one
    kernel, whose launch costs the host a fraction of CuPy's general copy."""
    cp = _cupy()
    if not _TRANSPOSE:
        _TRANSPOSE.append(cp.RawKernel(_TRANSPOSE_SOURCE, "rnngrad_transpose"))
    batch = a.shape[0] if a.ndim == 3 else 1
    cols, rows = a.shape[-2], a.shape[-1]
    out = cp.empty(a.shape, cp.float32)
    n = batch * rows * cols
    _TRANSPOSE[0]((min(-(-n // 256), 4096),), (256,),
                  (a, out, np.uint64(batch), np.uint64(rows), np.uint64(cols)))
    return out
