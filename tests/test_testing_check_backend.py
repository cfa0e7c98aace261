"""check_backend on an implementation written outside rnngrad: an LSTM with a z_state layout of
its own passes, a gate-order fault planted in it is caught, the reproduction runs as printed, and
a wrong shape is reported as shapes."""

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.testing import ReferenceMismatch, assert_matches_reference, check_backend
from rnngrad.testing.cases import random_case

# What the outside LSTM supports: one direction (reverse or not), MPSGraph's default
# activations and gate layout, no mask, no peephole.
SUPPORTED = {"bidirectional": False, "forget_gate_last": False,
             "input_gate_activation": rg.Activation.SIGMOID,
             "forget_gate_activation": rg.Activation.SIGMOID,
             "cell_gate_activation": rg.Activation.TANH,
             "output_gate_activation": rg.Activation.SIGMOID, "activation": rg.Activation.TANH}
WITHOUT = {"mask": False, "peephole": False}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _outside_lstm(order):
    """(forward, gradients) of an LSTM written without rnngrad, computing in the inputs' dtype,
    whose packed gates are read in ``order`` (MPSGraph's is "ifzo") and whose z_state is its own:
    [T,N,5H] holding the activated gates o, z, i, f and tanh(c[t])."""

    def check(descriptor, mask, peephole):
        descriptor = descriptor or rg.LSTMDescriptor()
        for name, value in SUPPORTED.items():
            if getattr(descriptor, name) != value:
                raise NotImplementedError(f"descriptor.{name}={getattr(descriptor, name)!r}")
        if mask is not None or peephole is not None:
            raise NotImplementedError("mask and peephole")
        return descriptor

    def blocks(a, H):
        return {k: a[..., j * H:(j + 1) * H] for j, k in enumerate(order)}

    def lstm(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
             init_cell=None, mask=None, peephole=None, *, descriptor=None):
        desc = check(descriptor, mask, peephole)
        x = source @ input_weight.T if input_weight is not None else source  # [T,N,4H]
        x = x + bias if bias is not None else x
        x = x[::-1] if desc.reverse else x
        T, N, H = x.shape[0], x.shape[1], recurrent_weight.shape[-1]
        h = init_state if init_state is not None else np.zeros((N, H), source.dtype)
        c = init_cell if init_cell is not None else np.zeros((N, H), source.dtype)
        hs, cs, zs = np.zeros((T, N, H), source.dtype), np.zeros((T, N, H), source.dtype), []
        for t in range(T):
            a = blocks(x[t] + h @ recurrent_weight.T, H)
            i, f, o, z = _sigmoid(a["i"]), _sigmoid(a["f"]), _sigmoid(a["o"]), np.tanh(a["z"])
            c = f * c + i * z
            tc = np.tanh(c)
            h = o * tc
            hs[t], cs[t] = h, c
            zs.append(np.concatenate([o, z, i, f, tc], axis=-1))  # [N,5H]
        zstate = np.stack(zs) if zs else np.zeros((0, N, 5 * H), source.dtype)
        if desc.training:
            return [hs, cs, zstate]
        return [hs, cs] if desc.produce_cell else [hs]

    def lstm_gradients(source, recurrent_weight, source_gradient, z_state, cell_output_fwd, *,
                       state_gradient=None, cell_gradient=None, input_weight=None, bias=None,
                       init_state=None, init_cell=None, mask=None, peephole=None, descriptor=None):
        desc = check(descriptor, mask, peephole)
        T, N, H = source_gradient.shape[0], source_gradient.shape[1], recurrent_weight.shape[-1]
        dt = source.dtype
        dy = np.array(source_gradient)
        if state_gradient is not None and T > 0:
            dy[T - 1] += state_gradient.reshape(N, H)
        per_step = cell_gradient is not None and cell_gradient.ndim == 3 and cell_gradient.shape[0] == T and T != 1
        dh_next = np.zeros((N, H), dt)
        if state_gradient is not None and T == 0:  # the final state is the initial state
            dh_next = dh_next + state_gradient.reshape(N, H)
        dc_next = np.zeros((N, H), dt)
        if cell_gradient is not None and not per_step:
            dc_next = dc_next + cell_gradient.reshape(N, H)
        h0 = init_state if init_state is not None else np.zeros((N, H), dt)
        c0 = init_cell if init_cell is not None else np.zeros((N, H), dt)
        dA = np.zeros((T, N, 4 * H), dt)
        dR = np.zeros_like(recurrent_weight)
        for t in range(T - 1, -1, -1):
            o, z, i, f, tc = (z_state[t][:, k * H:(k + 1) * H] for k in range(5))
            hp = h0 if t == 0 else z_state[t - 1][:, :H] * z_state[t - 1][:, 4 * H:]  # o ⊙ tanh(c)
            cp = c0 if t == 0 else cell_output_fwd[t - 1]
            dh = dy[t] + dh_next
            dc = dh * o * (1 - tc * tc) + dc_next + (cell_gradient[t] if per_step else 0)
            grads = {"o": dh * tc * o * (1 - o), "i": dc * z * i * (1 - i),
                     "f": dc * cp * f * (1 - f), "z": dc * i * (1 - z * z)}
            dA[t] = np.concatenate([grads[k] for k in order], axis=-1)
            dR += dA[t].T @ hp
            dh_next, dc_next = dA[t] @ recurrent_weight, dc * f
        dA = dA[::-1] if desc.reverse else dA
        out = [dA @ input_weight if input_weight is not None else dA, dR]
        if input_weight is not None:
            out.append(dA.reshape(-1, 4 * H).T @ source.reshape(-1, source.shape[-1]))
        if bias is not None:
            out.append(dA.sum(axis=(0, 1), keepdims=True))
        if init_state is not None:
            out.append(dh_next)
        if init_cell is not None:
            out.append(dc_next)
        return [np.asarray(a, dt) for a in out]

    return lstm, lstm_gradients


def _module_level(fn, name):
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    return fn


outside_lstm, outside_lstm_gradients = (_module_level(f, n) for f, n in zip(
    _outside_lstm("ifzo"), ("outside_lstm", "outside_lstm_gradients")))
# the planted fault: the forget and cell gates read from each other's blocks (i, z, f, o)
swapped_lstm, swapped_lstm_gradients = (_module_level(f, n) for f, n in zip(
    _outside_lstm("izfo"), ("swapped_lstm", "swapped_lstm_gradients")))

KNOBS = dict(descriptor=SUPPORTED, optional=WITHOUT)


def test_an_implementation_with_its_own_z_state_passes():
    assert check_backend(outside_lstm, "lstm", max_examples=25, seed=1, **KNOBS) > 25
    assert check_backend(outside_lstm_gradients, "lstm_gradients", forward=outside_lstm,
                         max_examples=25, seed=2, **KNOBS) > 25


def test_asking_for_z_state_compares_it():
    with pytest.raises(ReferenceMismatch, match="z_state: got shape"):
        check_backend(outside_lstm, "lstm", max_examples=5, seed=1, z_state=True, **KNOBS)


def test_a_planted_gate_order_fault_is_caught_and_its_reproduction_runs_as_printed():
    for op, kwargs in (("lstm", {}), ("lstm_gradients", {"forward": swapped_lstm})):
        candidate = swapped_lstm if op == "lstm" else swapped_lstm_gradients
        with pytest.raises(ReferenceMismatch) as info:
            check_backend(candidate, op, seed=3, **kwargs, **KNOBS)
        message = str(info.value)
        assert info.value.mismatches and "z_state" not in {m.quantity for m in info.value.mismatches}
        script = message.split("Reproduce with:\n", 1)[1]
        assert f"from {__name__} import {candidate.__name__} as candidate" in script
        with pytest.raises(ReferenceMismatch) as again:
            exec(script, {})
        assert [m.quantity for m in again.value.mismatches] == [m.quantity for m in info.value.mismatches]


def test_a_gradient_op_of_its_own_needs_its_own_forward():
    with pytest.raises(ValueError, match="forward: expected the forward"):
        check_backend(outside_lstm_gradients, "lstm_gradients", max_examples=1, **KNOBS)


def test_the_reproduction_of_unimportable_callables_runs_as_printed():
    case = random_case(5, "lstm", dtype=np.float32, descriptor=rg.LSTMDescriptor(),
                       optional={"mask": False, "peephole": False})

    def local_gradients(*args, **kwargs):
        out = outside_lstm_gradients(*args, **kwargs)
        out[0] = out[0] * 2
        return out

    with pytest.raises(ReferenceMismatch) as info:
        assert_matches_reference(local_gradients, case, "lstm_gradients",
                                 forward=lambda *a, **k: outside_lstm(*a, **k))
    script = str(info.value).split("Reproduce with:\n", 1)[1]
    compile(script, "<reproduction>", "exec")
    with pytest.raises(ReferenceMismatch, match="NotImplementedError: replace this stub with"):
        exec(script, {})


def test_a_shape_mismatch_says_the_shapes():
    case = random_case(6, "lstm", dtype=np.float32, descriptor=rg.LSTMDescriptor(),
                       optional={"bias": True, "mask": False, "peephole": False})
    H = case.H

    def squeezed(*args, **kwargs):
        out = outside_lstm_gradients(*args, **kwargs)
        return [a.reshape(-1) if a.ndim == 3 and a.shape[:2] == (1, 1) else a for a in out]

    with pytest.raises(ReferenceMismatch) as info:
        assert_matches_reference(squeezed, case, "lstm_gradients", forward=outside_lstm)
    assert f"bias: got shape ({4 * H},), reference shape (1, 1, {4 * H})" in str(info.value)
    assert "nan" not in str(info.value).split("Reproduce with:")[0]
