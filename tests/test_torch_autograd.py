"""rnngrad.torch's autograd functions: gradcheck in float64 against finite differences for every
cell and option (reference backend), the backward equal to rnngrad's own gradient ops, inputs that
need no gradient get none computed, tensors shared with the backend's arrays, device dispatch
and its errors, double backward refused."""

import itertools

import numpy as np
import pytest

import rnngrad
from rnngrad.api import FORWARD_OPS
from rnngrad.testing import compare_array

torch = pytest.importorskip("torch")
import rnngrad.torch as rt  # noqa: E402
from rnngrad.torch import _device, functions, ops  # noqa: E402

G = {"single_gate": 1, "gru": 3, "lstm": 4}
FUNCTIONAL = {"single_gate": rt.single_gate_rnn, "gru": rt.gru, "lstm": rt.lstm}


def _inputs(cell, desc, *, T=3, N=2, I=2, H=2, projected=False, bias=True, init=True,
            mask=None, extra=True, seed=0):
    """Random float64 tensors for one call, every one needing its gradient but the mask."""
    g = torch.Generator().manual_seed(seed)
    D = 2 if desc.bidirectional else 1
    rand = lambda *shape, scale=0.6: (torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
                                      * scale).requires_grad_()
    given = dict.fromkeys(functions.INPUTS[cell])
    GH = G[cell] * H
    given["source"] = rand(T, N, D * GH if projected else I, scale=1.0)
    given["recurrent_weight"] = rand(GH, H) if D == 1 else rand(2, GH, H)
    if not projected:
        given["input_weight"] = rand(D * GH, I)
    if bias:
        given["bias"] = rand(D * GH)
    if init:
        given["init_state"] = rand(N, D * H)
        if cell == "lstm":
            given["init_cell"] = rand(N, D * H)
    if mask == "shared":
        given["mask"] = (torch.rand(N, D * H, generator=g) > 0.3).double()
    elif mask == "per_step":
        given["mask"] = (torch.rand(T, N, D * H, generator=g) > 0.3).double()
    if extra and cell == "lstm":
        given["peephole"] = rand(4 * H) if D == 1 else rand(2, 4 * H)
    if extra and cell == "gru":
        given["secondary_bias"] = rand(D * H)
    return given


def _gradcheck(cell, desc, given, backend="reference"):
    names = [k for k, v in given.items() if v is not None and v.requires_grad]

    def f(*tensors):
        call = dict(given, **dict(zip(names, tensors)))
        return tuple(FUNCTIONAL[cell](**call, descriptor=desc, backend=backend))
    assert torch.autograd.gradcheck(f, tuple(given[k] for k in names))


ACTS = [a.name.lower() for a in rnngrad.Activation]

SINGLE_GATE = [dict(activation=a) for a in ACTS] + [
    dict(activation="tanh", reverse=True), dict(activation="tanh", bidirectional=True)]
GRU_OPTIONS = [dict(reset_gate_first=r, reset_after=a, flip_z=z)
               for r, a, z in itertools.product((False, True), repeat=3)] + [
    dict(bidirectional=True, reset_after=True), dict(reverse=True, reset_gate_first=True),
    dict(update_gate_activation="hard_sigmoid", reset_gate_activation="relu",
         output_gate_activation="sigmoid", reset_after=True),
    dict(update_gate_activation="none", output_gate_activation="hard_sigmoid")]
LSTM_OPTIONS = [dict(), dict(forget_gate_last=True), dict(bidirectional=True),
                dict(reverse=True),
                dict(input_gate_activation="hard_sigmoid", forget_gate_activation="tanh",
                     cell_gate_activation="relu", output_gate_activation="none",
                     activation="sigmoid"),
                dict(bidirectional=True, forget_gate_last=True, activation="hard_sigmoid")]
CASES = ([("single_gate", o) for o in SINGLE_GATE] + [("gru", o) for o in GRU_OPTIONS]
         + [("lstm", o) for o in LSTM_OPTIONS])
DESCRIPTORS = {"single_gate": rnngrad.SingleGateRNNDescriptor, "gru": rnngrad.GRUDescriptor,
               "lstm": rnngrad.LSTMDescriptor}


def _id(case):
    cell, options = case
    return cell + "-" + "-".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gradcheck_every_option(case):
    cell, options = case
    desc = DESCRIPTORS[cell](**options)
    _gradcheck(cell, desc, _inputs(cell, desc, seed=len(_id(case))))


@pytest.mark.parametrize("cell", list(G))
@pytest.mark.parametrize("mask", ["shared", "per_step"])
def test_gradcheck_with_mask_bidirectional(cell, mask):
    desc = DESCRIPTORS[cell](bidirectional=True)
    _gradcheck(cell, desc, _inputs(cell, desc, mask=mask, seed=3))


@pytest.mark.parametrize("cell", list(G))
def test_gradcheck_projected_source_without_optional_inputs(cell):
    desc = DESCRIPTORS[cell]()
    _gradcheck(cell, desc, _inputs(cell, desc, projected=True, bias=False, init=False, extra=False))


@pytest.mark.parametrize("cell", list(G))
@pytest.mark.parametrize("backend", [b for b in ("numba",) if b in rnngrad.available_backends()])
def test_gradcheck_on_a_fast_backend(cell, backend):
    desc = DESCRIPTORS[cell](bidirectional=True)
    _gradcheck(cell, desc, _inputs(cell, desc, mask="shared", seed=5), backend=backend)


def _numpy(given):
    return {k: None if v is None else v.detach().numpy() for k, v in given.items()}


@pytest.mark.parametrize("cell", list(G))
def test_backward_equals_the_gradient_op(cell):
    """Each output's gradient reaches the op as SEMANTICS.md §3.1 says: h's as source_gradient, the
    final state's as state_gradient, c's as the per-step and the final cell's as the final-cell
    cell_gradient (added at each direction's last step); every input gets its entry."""
    desc = DESCRIPTORS[cell](bidirectional=True)
    given = _inputs(cell, desc, T=4, N=3, I=3, H=3, mask="shared", seed=7)
    out = FUNCTIONAL[cell](**given, descriptor=desc, backend="reference")
    g = torch.Generator().manual_seed(1)
    ups = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out]
    torch.autograd.backward(list(out), ups)

    arrays = _numpy(given)
    op = getattr(rnngrad, FORWARD_OPS[cell])  # the public functions, checked as a user calls them
    fwd = op(**arrays, descriptor=ops.with_outputs(desc, True), backend="reference")
    want_h = fwd.state
    assert compare_array("state", out.state.detach().numpy(), want_h, np.float64)[1] is None
    H = 3
    up = dict(source_gradient=ups[0].numpy(), state_gradient=ups[-2 if cell == "lstm" else 1].numpy())
    kw = {k: v for k, v in arrays.items() if v is not None}
    if cell == "gru":
        kw["output_fwd"] = fwd.state
    if cell == "lstm":
        cell_gradient = ups[1].numpy().copy()
        cell_gradient[-1, :, :H] += ups[3].numpy()[:, :H]
        cell_gradient[0, :, H:] += ups[3].numpy()[:, H:]
        kw.update(cell_output_fwd=fwd.cell, cell_gradient=cell_gradient)
    want = getattr(rnngrad, FORWARD_OPS[cell] + "_gradients")(
        z_state=fwd.z_state, **kw, **up, descriptor=desc, backend="reference")
    for name in want.names:
        got = given[name].grad.numpy()
        ratio, mismatch = compare_array(name, got, getattr(want, name).reshape(got.shape), np.float64)
        assert mismatch is None, f"{name}: {mismatch}"
    assert given["mask"].grad is None


def test_inputs_without_gradient_get_none_and_the_op_is_not_asked(op_calls):
    desc = rnngrad.GRUDescriptor(reset_after=True)
    given = _inputs("gru", desc)
    for name in ("bias", "secondary_bias", "init_state", "source"):
        given[name].requires_grad_(False)
    out = rt.gru(**given, descriptor=desc, backend="reference")
    out.state.sum().backward()
    calls = [sorted(k for k, v in given.items() if v is not None)
             for cell, gradients, _, given, _ in op_calls if gradients]
    assert "bias" not in calls[0] and "secondary_bias" not in calls[0]
    assert "init_state" in calls[0]  # its value enters the recurrence
    # no source gradient wanted: no input weight either, so d_source = dA W is skipped
    assert "input_weight" not in calls[0]
    assert all(given[k].grad is None for k in ("bias", "secondary_bias", "init_state", "source"))
    assert given["recurrent_weight"].grad is not None and given["input_weight"].grad is not None
    # the weight gradients are those of a call where everything needs a gradient
    full = {k: None if v is None else v.detach().clone().requires_grad_(k != "mask")
            for k, v in given.items()}
    rt.gru(**full, descriptor=desc, backend="reference").state.sum().backward()
    for name in ("recurrent_weight", "input_weight"):
        ratio, mismatch = compare_array(name, given[name].grad.numpy(), full[name].grad.numpy(),
                                        np.float64)
        assert mismatch is None, f"{name}: {mismatch}"


def test_no_gradient_wanted_runs_the_forward_only(op_calls):
    desc = rnngrad.LSTMDescriptor()
    given = _inputs("lstm", desc)
    with torch.no_grad():
        a = rt.lstm(**given, descriptor=desc, backend="reference")
    b = rt.lstm(**given, descriptor=desc, backend="reference")
    assert [d.training for _, gradients, d, _, _ in op_calls if not gradients] == [False, True]
    assert not a.state.requires_grad and b.state.requires_grad
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y.detach(), rtol=0, atol=0)


def test_cpu_tensors_are_shared_with_the_backend_arrays(op_calls):
    """No copy on the way in (C-contiguous tensors reach the op as views of their memory) nor
    on the way out (h and c are the op's arrays)."""
    desc = rnngrad.LSTMDescriptor()
    given = _inputs("lstm", desc)
    out = rt.lstm(**given, descriptor=desc, backend="reference")
    seen = {"in": op_calls[0][3], "out": op_calls[0][4]}
    for name, t in given.items():
        if t is not None:
            assert np.shares_memory(seen["in"][name], t.detach().numpy()), name
    assert out.state.data_ptr() == seen["out"].h.__array_interface__["data"][0]
    assert out.cell.data_ptr() == seen["out"].c.__array_interface__["data"][0]


def test_non_contiguous_and_expanded_tensors_give_the_same_results():
    desc = rnngrad.GRUDescriptor(bidirectional=True)
    given = _inputs("gru", desc, T=4, N=3, I=3, H=2)
    strided = dict(given, source=given["source"].detach().transpose(0, 1).contiguous()
                   .transpose(0, 1).requires_grad_())
    a = rt.gru(**given, descriptor=desc, backend="reference")
    b = rt.gru(**strided, descriptor=desc, backend="reference")
    torch.testing.assert_close(a.state, b.state, rtol=0, atol=0)
    a.state.sum().backward()  # an expanded (stride-0) gradient of ones
    b.state.backward(torch.ones_like(b.state))
    torch.testing.assert_close(given["source"].grad, strided["source"].grad, rtol=0, atol=0)


def test_empty_sequence_final_state_is_the_initial_one():
    desc = rnngrad.LSTMDescriptor(bidirectional=True)
    given = _inputs("lstm", desc, T=0)
    out = rt.lstm(**given, descriptor=desc, backend="reference")
    torch.testing.assert_close(out.final_state, given["init_state"].detach())
    torch.testing.assert_close(out.final_cell, given["init_cell"].detach())
    (out.final_state.sum() + 2 * out.final_cell.sum()).backward()
    torch.testing.assert_close(given["init_state"].grad, torch.ones_like(given["init_state"]))
    torch.testing.assert_close(given["init_cell"].grad, 2 * torch.ones_like(given["init_cell"]))


def test_the_function_classes_apply_directly():
    desc = rnngrad.SingleGateRNNDescriptor(activation="tanh")
    given = _inputs("single_gate", desc)
    h, h_n = rt.SingleGateRNNFunction.apply(desc, "reference", *given.values())
    torch.testing.assert_close(h_n, h[-1])
    h.sum().backward()
    assert given["input_weight"].grad is not None


def test_double_backward_is_refused_with_a_clear_error():
    desc = rnngrad.GRUDescriptor()
    given = _inputs("gru", desc)
    out = rt.gru(**given, descriptor=desc, backend="reference")
    (first,) = torch.autograd.grad(out.state.sum(), given["input_weight"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        first.sum().backward()  # the gradient op's own backward
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.functional.hessian(
            lambda W: rt.gru(given["source"].detach(), given["recurrent_weight"].detach(), W,
                             backend="reference").state.sum(),
            given["input_weight"].detach())


def test_wrong_inputs_name_the_argument():
    x, R = torch.zeros(3, 2, 6), torch.zeros(6, 2)
    with pytest.raises(TypeError, match="recurrent_weight: expected a torch.Tensor"):
        rt.gru(x, np.zeros((6, 2)))
    with pytest.raises(TypeError, match=r"source: expected a floating tensor, got torch.int64, "
                                         r"which no rnngrad backend computes in"):
        rt.gru(x.long(), R)
    with pytest.raises(TypeError, match="descriptor: expected an rnngrad.GRUDescriptor"):
        rt.gru(x, R, descriptor=rnngrad.LSTMDescriptor())
    with pytest.raises(ValueError, match=r"recurrent_weight: expected shape"):
        rt.gru(x, torch.zeros(5, 2))
    with pytest.raises(TypeError, match="share one floating dtype"):
        rt.gru(x, R.double())


# -- devices ----------------------------------------------------------------------------------

def test_tensors_on_a_device_no_backend_serves_are_refused():
    with pytest.raises(RuntimeError, match=r"tensors on xla:0: no rnngrad backend runs on 'xla' "
                                           r"devices; 'metal-cuda' serves CUDA tensors"):
        _device.backend_for(torch.device("xla", 0), None)


def test_tensors_on_two_devices_are_refused():
    with pytest.raises(ValueError, match="expected every tensor on one device, got source on "
                                         "cpu, recurrent_weight on meta"):
        _device.device_of({"source": torch.zeros(3, 2, 6),
                           "recurrent_weight": torch.zeros(6, 2, device="meta")})


def test_cuda_tensors_without_metal_cuda_name_the_device_and_the_backends(monkeypatch):
    monkeypatch.setattr(rnngrad, "available_backends", lambda: ("numba", "reference"))
    with pytest.raises(RuntimeError, match=r"tensors on cuda:1: no rnngrad backend available "
                                           r"here runs on CUDA devices \(the 'metal-cuda' backend "
                                           r"would: .*\); the available backends \('numba', "
                                           r"'reference'\) run on the CPU"):
        _device.backend_for(torch.device("cuda", 1), None)
    with pytest.raises(ValueError, match=r"backend: 'numba' runs on the CPU, got tensors on cuda:0"):
        _device.backend_for(torch.device("cuda", 0), "numba")
    with pytest.raises(ValueError, match=r"backend: 'metal-cuda' runs on CUDA devices, got "
                                         r"tensors on cpu"):
        _device.backend_for(torch.device("cpu"), "metal-cuda")


def test_cuda_tensors_go_to_metal_cuda_when_it_is_available(monkeypatch):
    monkeypatch.setattr(rnngrad, "available_backends", lambda: ("metal-cuda", "numba", "reference"))
    assert _device.backend_for(torch.device("cuda", 0), None) == "metal-cuda"
    assert _device.backend_for(torch.device("cuda", 0), "metal-cuda") == "metal-cuda"
    assert _device.backend_for(torch.device("cpu"), None) is None  # rnngrad picks a CPU one


def _cuda_ready():
    return torch.cuda.is_available() and rt.CUDA_BACKEND in rnngrad.available_backends()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device and the metal-cuda backend")
@pytest.mark.parametrize("cell", list(G))
def test_cuda_tensors_run_on_metal_cuda_and_match_the_cpu(cell):
    desc = DESCRIPTORS[cell](bidirectional=True)
    cpu = {k: None if v is None else v.detach().float().requires_grad_(k != "mask")
           for k, v in _inputs(cell, desc, T=5, N=3, I=4, H=8).items()}
    gpu = {k: None if v is None else v.detach().cuda().requires_grad_(k != "mask")
           for k, v in cpu.items()}
    a = FUNCTIONAL[cell](**cpu, descriptor=desc)
    b = FUNCTIONAL[cell](**gpu, descriptor=desc)
    assert b.state.device.type == "cuda"
    sum(o.sum() for o in a).backward()
    sum(o.sum() for o in b).backward()
    for name in ["state"]:
        assert compare_array(name, getattr(b, name).detach().cpu().numpy(),
                             getattr(a, name).detach().numpy(), np.float32)[1] is None
    for name, t in cpu.items():
        if t is not None and t.grad is not None:
            assert compare_array(name, gpu[name].grad.cpu().numpy(), t.grad.numpy(),
                                 np.float32)[1] is None, name


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device and the metal-cuda backend")
@pytest.mark.parametrize("cell", list(G))
def test_cuda_tensors_on_a_side_stream_and_strided_views_give_the_default_streams_results(cell):
    """The tensors cross into the backend directly on the legacy default stream and through
    DLPack's stream handshake on another; a strided view crosses as one."""
    desc = DESCRIPTORS[cell](bidirectional=True)
    T, N, I, H = 6, 3, 4, 8

    def run(stream, strided):
        given = {k: None if v is None else v.detach().float().cuda()
                 for k, v in _inputs(cell, desc, T=T, N=N, I=I, H=H).items()}
        if strided:  # the same values, every input a non-contiguous view
            given = {k: None if v is None else torch.stack([v, -v], -1)[..., 0]
                     for k, v in given.items()}
            assert not given["source"].is_contiguous()
        for v in given.values():
            if v is not None:
                v.requires_grad_()
        with torch.cuda.stream(stream):
            torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
            # a long kernel queued just before the call on the same stream: the backend must
            # read the source after it
            source = given["source"]
            scaled = source * 3.0
            out = FUNCTIONAL[cell](**dict(given, source=scaled / 3.0), descriptor=desc)
            sum((o.double() ** 2).sum() for o in out).backward()
        torch.cuda.synchronize()
        return [o.detach().cpu() for o in out] + [source.grad.cpu(),
                                                   given["recurrent_weight"].grad.cpu()]
    base = run(torch.cuda.default_stream(), False)
    for stream, strided in ((torch.cuda.Stream(), False), (torch.cuda.default_stream(), True)):
        for a, b in zip(run(stream, strided), base):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_gradients_reach_grad_without_copies(op_calls):
    """The gradient op's arrays become the leaves' .grad themselves (PyTorch's AccumulateGrad
    takes a tensor nobody else holds as it is)."""
    desc = rnngrad.SingleGateRNNDescriptor(activation="tanh")
    given = _inputs("single_gate", desc, extra=False)
    rt.single_gate_rnn(**given, descriptor=desc, backend="reference").state.sum().backward()
    seen = {"out": next(out for _, gradients, _, _, out in op_calls if gradients)}
    for name in ("source", "input_weight", "recurrent_weight", "init_state"):
        assert given[name].grad.data_ptr() == \
            getattr(seen["out"], name).__array_interface__["data"][0], name
