"""What crosses the boundary between the public functions and a backend.

The public functions check every input (``rnngrad.validation``) and hand a backend one
:class:`Problem`: C-contiguous arrays of one floating dtype in fixed, normalised shapes, so that
no backend ever parses shapes or options of its own. A backend returns :class:`ForwardArrays` or
:class:`GradientArrays` in the same normalised shapes; the public functions put them back in the
shapes the caller gave and in MPSGraph's order.

Shapes (``T`` steps, ``N`` batch, ``I`` input features, ``H`` hidden units, ``G`` gates,
``D`` directions, ``Z`` blocks of H in z_state per direction: G, or 4 for GRU with reset_after):

====================  ===================================================================
source                [T,N,I] with input_weight, else [T,N,D·G·H]
recurrent_weight      [D,G·H,H]      (the caller's [G·H,H] gets a leading 1)
input_weight          [D·G·H,I] or None
bias                  [D·G·H] or None
init_state            [N,D·H] or None
init_cell             [N,D·H] or None        (LSTM)
mask                  None, [N,D·H] (every step) or [T,N,D·H] (per processing step)
peephole              [D,4H] or None          (LSTM)
secondary_bias        [D·H] or None           (GRU)
source_gradient       [T,N,D·H]               (gradients only)
z_state               [T,N,D·Z·H]
output_fwd            [T,N,D·H] or None       (GRU gradients)
cell_output_fwd       [T,N,D·H] or None       (LSTM gradients)
state_gradient        [N,D·H] or None
cell_gradient         None, [N,D·H] (final cell) or [T,N,D·H] (per step)   (LSTM)
====================  ===================================================================
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import numpy as np

from .backends.metal.mps.tensors import is_device_tensor


def on_gpu(value) -> bool:
    """Whether ``value`` lives in GPU memory: in CUDA device memory (a CuPy array, a CUDA
    tensor, anything with ``__cuda_array_interface__``), or a tensor the backends take where it
    is (an MPS tensor: :mod:`rnngrad.backends.metal.mps.tensors`). A NumPy array and a CuPy array (of the module
    imported as ``cupy``) are told by their type alone: CuPy builds the interface's dict at
    every access, and the checks and the host ask this of every input."""
    kind = type(value)
    if kind is np.ndarray:
        return False
    cupy = sys.modules.get("cupy")
    if cupy is not None and kind is getattr(cupy, "ndarray", None):
        return True
    if is_device_tensor(value):
        return True
    return hasattr(value, "__cuda_array_interface__")


def address(array) -> int:
    """The device address of a GPU array's first element: CuPy's ``data.ptr``, else from
    ``__cuda_array_interface__``."""
    ptr = getattr(array.data, "ptr", None)
    return ptr if ptr is not None else array.__cuda_array_interface__["data"][0]


@dataclasses.dataclass
class Problem:
    """One validated call of one op. ``gradients`` tells forward from gradient ops. Backends
    only read it. (Not a frozen dataclass: its ``__init__`` would set the 26 fields one
    ``object.__setattr__`` at a time, several times slower, on every op.)"""

    cell: str  # "single_gate" | "gru" | "lstm"
    gradients: bool
    descriptor: object
    dtype: np.dtype
    T: int
    N: int
    I: Optional[int]  # None without input_weight
    H: int
    G: int
    D: int
    Z: int
    source: np.ndarray
    recurrent_weight: np.ndarray
    input_weight: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None
    init_state: Optional[np.ndarray] = None
    init_cell: Optional[np.ndarray] = None
    mask: Optional[np.ndarray] = None
    peephole: Optional[np.ndarray] = None
    secondary_bias: Optional[np.ndarray] = None
    source_gradient: Optional[np.ndarray] = None
    z_state: Optional[np.ndarray] = None
    output_fwd: Optional[np.ndarray] = None
    cell_output_fwd: Optional[np.ndarray] = None
    state_gradient: Optional[np.ndarray] = None
    cell_gradient: Optional[np.ndarray] = None

    @property
    def op(self) -> str:
        name = "single_gate_rnn" if self.cell == "single_gate" else self.cell
        return name + ("_gradients" if self.gradients else "")

    @property
    def on_gpu(self) -> bool:
        """Whether the inputs are in GPU memory (CuPy arrays, or tensors the backends take where
        they are: :mod:`rnngrad.backends.metal.mps.tensors`)."""
        return on_gpu(self.source)

    @property
    def mask_per_step(self) -> bool:
        return self.mask is not None and self.mask.ndim == 3

    @property
    def cell_gradient_per_step(self) -> bool:
        return self.cell_gradient is not None and self.cell_gradient.ndim == 3

    def arrays(self) -> dict:
        """The array fields that are present, by name."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }

    def astype(self, dtype) -> "Problem":
        """The same problem with every array cast to ``dtype`` (C-contiguous)."""
        dtype = np.dtype(dtype)
        cast = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in self.arrays().items()}
        return dataclasses.replace(self, dtype=dtype, **cast)


@dataclasses.dataclass
class ForwardArrays:
    """A backend's forward result: h [T,N,D·H]; c [T,N,D·H] (LSTM, when training or
    produce_cell); z_state [T,N,D·Z·H] (when training). Absent entries are None."""

    h: np.ndarray
    c: Optional[np.ndarray] = None
    z_state: Optional[np.ndarray] = None


@dataclasses.dataclass
class GradientArrays:
    """A backend's gradients, in the normalised shapes of :class:`Problem`:
    source like the problem's source, recurrent_weight [D,G·H,H], input_weight [D·G·H,I],
    bias [1,1,D·G·H], peephole [D,4H], init_state / init_cell [N,D·H], secondary_bias [D·H].
    An entry is None when its input was not given."""

    source: np.ndarray
    recurrent_weight: np.ndarray
    input_weight: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None
    peephole: Optional[np.ndarray] = None
    init_state: Optional[np.ndarray] = None
    init_cell: Optional[np.ndarray] = None
    secondary_bias: Optional[np.ndarray] = None
