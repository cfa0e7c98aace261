"""metal-cuda's ops that do not wait: they queue their kernels on PyTorch's current stream (CuPy's
for CuPy arrays) with their memory from PyTorch's caching allocator, return at once, and have
their completion checked on the GPU (a check kernel that records a failure in pinned host
memory): in eager calls, in a CUDA graph captured by hand and under torch.compile's
reduce-overhead mode. Needs an NVIDIA GPU (``gpu`` marker)."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnngrad  # noqa: E402
import rnngrad.torch as rt  # noqa: E402


def _ready():
    if not torch.cuda.is_available():
        return "needs a CUDA device (torch.cuda.is_available() is False)"
    if rt.CUDA_BACKEND not in rnngrad.available_backends():
        return f"needs the {rt.CUDA_BACKEND} backend (CuPy)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_ready() is not None, reason=str(_ready()))]


def _lstm(seed=0, **options):
    torch.manual_seed(seed)
    module = torch.nn.LSTM(16, 32, **options)
    return module.cuda(), rt.from_torch(module).cuda()


def _step(layer, x, dy):
    """A training step's outputs and gradients: {name: tensor}."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    output, (h_n, c_n) = layer(x)
    output.backward(dy)
    out = {"output": output.detach(), "h_n": h_n.detach(), "x": x.grad}
    out.update({k: p.grad for k, p in layer.named_parameters()})
    return out


def test_an_op_returns_before_the_gpu_has_run_it():
    """Behind a long kernel on PyTorch's stream, a training step through the layer returns long
    before the GPU reaches it (no host-device synchronisation inside rnngrad), and gives what it
    gives with nothing in front."""
    module, layer = _lstm()
    x = torch.randn(20, 4, 16, device="cuda")
    dy = torch.randn(20, 4, 32, device="cuda")
    want = _step(layer, x, dy)
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time, queued first
    got = _step(layer, x, dy)
    returned = time.perf_counter() - start
    torch.cuda.synchronize()
    waited = time.perf_counter() - start
    assert returned < 0.25 * waited, (returned, waited)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)
    rnngrad.synchronize()


def test_ops_on_a_side_stream_and_memory_from_pytorch():
    """On a stream of the caller's, the ops queue there and give the default stream's results;
    their outputs are PyTorch's memory (CuPy's pool does not grow)."""
    import cupy

    module, layer = _lstm(seed=1, bidirectional=True)
    x = torch.randn(12, 3, 16, device="cuda")
    dy = torch.randn(12, 3, 64, device="cuda")
    want = _step(layer, x, dy)
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _step(layer, x, dy)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert pool.used_bytes() == before
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)
    rnngrad.synchronize()


def test_the_check_kernel_reports_an_unfinished_dispatch_without_a_wait():
    """The CUDA target's check of marks, on marks made by hand: all there passes; one missing
    is recorded (serial, dispatch, threadgroup, word) where the host reads it."""
    import cupy

    from rnngrad.backends.metal import cuda

    dev = cuda.Device(timing=False)
    table = np.array([[0, 3, 3, 64, 5], [6, 2, 1, 32, 0]], np.uint32)
    words = np.zeros(10, np.uint32)
    words[0:6:2], words[1:6:2] = 0x80000000 | 5, 64
    words[6], words[7] = 0x80000000, 32
    marks = cupy.asarray(words).view(cupy.uint8)
    dev.check_marks(marks, table, 7)
    dev.synchronize()
    assert dev.fault() is None
    words[2] = 0  # threadgroup 1 of dispatch 0 left no mark
    dev.check_marks(cupy.asarray(words).view(cupy.uint8), table, 8)
    dev.synchronize()
    assert dev.fault() == (8, 0, 1, 0)
    dev.clear_fault()
    assert dev.fault() is None


def test_a_graph_captured_by_hand_replays_the_step_and_its_check():
    """A training step captured with torch.cuda.graph (after a warm-up on a side stream, as
    PyTorch asks) replays to the eager results with new inputs; the marks' check kernel is in
    the graph: replays of a captured check on marks made wrong afterwards report the failure."""
    module, layer = _lstm(seed=2)
    x = torch.randn(10, 2, 16, device="cuda")
    dy = torch.randn(10, 2, 32, device="cuda")
    static_x, static_dy = x.clone(), dy.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up runs what the capture will (x needs no gradient)
        for _ in range(2):
            output, _ = layer(static_x)
            output.backward(static_dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        output, _ = layer(static_x)
        output.backward(static_dy)
    for seed in (3, 4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        new_x = torch.randn(x.shape, device="cuda", generator=g)
        static_x.copy_(new_x)
        for p in layer.parameters():
            p.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        want = _step(_lstm(seed=2)[1], new_x, static_dy)
        torch.testing.assert_close(output, want["output"], rtol=0, atol=0)
        for name, p in layer.named_parameters():
            torch.testing.assert_close(p.grad, want[name], rtol=0, atol=0, msg=name)
    rnngrad.synchronize()

    import cupy

    from rnngrad.backends.metal.backends import CUDA_HOST

    dev = CUDA_HOST.device
    table = np.array([[0, 1, 1, 32, 0]], np.uint32)
    marks = cupy.asarray(np.array([0x80000000, 32], np.uint32)).view(cupy.uint8)
    serial = 10 ** 9  # described nowhere: the error says so
    dev.check_marks(marks, table, serial)  # its table, made before the capture
    check = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), cupy.cuda.ExternalStream(stream.cuda_stream):
        check.capture_begin()
        dev.check_marks(marks, table, serial)
        check.capture_end()
    check.replay()
    torch.cuda.synchronize()
    assert dev.fault() is None
    marks.view(cupy.uint32)[0] = 0
    check.replay()
    torch.cuda.synchronize()
    with pytest.raises(rnngrad.backends.metal.IncompleteDispatch):
        rnngrad.synchronize()


def test_reduce_overhead_captures_the_layers_and_gives_the_eager_results():
    """torch.compile(mode="reduce-overhead") on Linear + rnngrad LSTM and GRU: no cudagraph
    skip, and the compiled training step gives the eager one's outputs and gradients."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(5)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 16)
            self.lstm = rt.LSTM(16, 32)
            self.gru = rt.GRU(32, 24)

        def forward(self, x):
            return self.gru(self.lstm(self.head(x))[0])[0].sum()

    model = Model().cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(9, 3, 8, device="cuda", generator=g)
        model.zero_grad(set_to_none=True)
        want = model(x)
        want.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        got = compiled(x)
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[name], rtol=1e-5, atol=1e-5, msg=name)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    rnngrad.synchronize()
