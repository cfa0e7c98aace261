"""PyTorch's MPS layers (``torch.nn.RNN``, ``GRU``, ``LSTM`` on the ``"mps"`` device, which
PyTorch runs with MPSGraph's recurrent ops plus its own glue) against rnngrad's float64
reference, with :func:`rnngrad.testing.check_module`, on a Mac with Apple silicon:

    python -m verification.check_module_mps                 # the three cells, default settings
    python -m verification.check_module_mps --cell lstm --examples 200 --seed 1

MPS has no float64: every problem is float32, and dropout's train-mode gradients are checked
against float32 central differences (looser tolerances, rnngrad.testing.module's
DIFFERENCE_TOLERANCES). One line per cell: passed (problems, unsupported, seconds) or the
shrunk failure with its reproduction. Exit status 1 when a cell fails; 2 when this machine has
no MPS device (anything but macOS on Apple silicon, or a PyTorch built without MPS).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time


def mps_unavailable():
    """None when PyTorch's "mps" device can run here, else why not."""
    if platform.system() != "Darwin":
        return (f"this check needs a Mac with Apple silicon (PyTorch's \"mps\" device); this "
                f"machine runs {platform.system()} on {platform.machine()}")
    try:
        import torch
    except ImportError:
        return "this check needs PyTorch (pip install torch)"
    if not torch.backends.mps.is_available():
        built = torch.backends.mps.is_built()
        return ("PyTorch's \"mps\" device is not available: "
                + ("macOS 12.3 or later on Apple silicon is needed" if built
                   else "this PyTorch was built without MPS"))
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verification.check_module_mps",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--cell", action="append", choices=("rnn", "gru", "lstm"),
                        help="only these cells (default: all three)")
    parser.add_argument("--examples", type=int, default=None,
                        help="max_examples of check_module (default: its own)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (default: random)")
    args = parser.parse_args(argv)
    why = mps_unavailable()
    if why:
        print(f"check_module_mps: {why}; nothing was checked.", file=sys.stderr)
        return 2
    import torch

    from rnngrad.testing.module import ModuleMismatch, check_module

    layers = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}
    knobs = {} if args.examples is None else {"max_examples": args.examples}
    failed = False
    for cell in args.cell or ("rnn", "gru", "lstm"):
        start = time.perf_counter()
        try:
            print(check_module(layers[cell], cell, device="mps", dtype="float32", seed=args.seed,
                               **knobs), flush=True)
        except ModuleMismatch as exc:
            failed = True
            print(f"torch.nn.{layers[cell].__name__} on mps FAILED after {exc.examples} problems "
                  f"({time.perf_counter() - start:.1f}s):\n{exc}\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
