"""The CUDA target's check tables kept in pinned host memory (those first met inside a CUDA graph's
capture, where nothing can be allocated or copied): written once, read back where their address
says, never moved or overwritten, and a clear error once the block is full. Runs without a GPU:
the pinned block is stood in for by host memory with the same interface."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rnngrad.backends.metal.cuda._kernels import _HostTables


def _pinned(nbytes):
    """What ``cupy.cuda.alloc_pinned_memory`` returns, as far as _HostTables uses it: bytes with
    the buffer protocol and their address as ``ptr``."""
    memory = (ctypes.c_uint8 * nbytes)()
    memory.ptr = ctypes.addressof(memory)
    return memory


class _FakeCupy:
    class cuda:
        alloc_pinned_memory = staticmethod(_pinned)


def _at(address, n):
    return np.ctypeslib.as_array((ctypes.c_uint32 * n).from_address(address)).copy()


def test_each_table_is_written_once_and_read_back_at_its_address():
    tables = _HostTables(_FakeCupy, 1 << 10)
    rng = np.random.default_rng(0)
    made = [rng.integers(0, 2 ** 32, size=(n, 5), dtype=np.uint32) for n in (1, 3, 2)]
    addresses = [tables.address(t.tobytes()) for t in made]
    assert len(set(addresses)) == 3
    spans = sorted((a, a + t.nbytes) for a, t in zip(addresses, made))
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap
    assert tables.address(made[1].tobytes()) == addresses[1]  # the same table: not written again
    for address, table in zip(addresses, made):
        np.testing.assert_array_equal(_at(address, table.size), table.reshape(-1))


def test_a_full_block_raises_and_leaves_the_tables_made():
    tables = _HostTables(_FakeCupy, 100)  # 25 words: two tables of 2 rows
    first = np.arange(10, dtype=np.uint32).reshape(2, 5)
    second = first + 100
    a, b = tables.address(first.tobytes()), tables.address(second.tobytes())
    with pytest.raises(RuntimeError, match="expected at most 100 bytes in all, got 120"):
        tables.address((first + 7).tobytes())
    np.testing.assert_array_equal(_at(a, 10), first.reshape(-1))
    np.testing.assert_array_equal(_at(b, 10), second.reshape(-1))
