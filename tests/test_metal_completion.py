"""No silently wrong result from the Metal path: every kernel's completion marks, checked by the
host after each dispatch, turn a dispatch that stopped part-way (some threadgroups never ran)
or that reported a GPU timeout into rnngrad.backends.metal.IncompleteDispatch, naming the
kernel, the op, the problem size and the dispatch; the op then returns nothing. The failures
are injected by the CPU harness (``Device(stop=..., timeout=...)``), at every dispatch of every
op of every cell, with threadgroups of 32 threads so that every recurrence dispatch has
several (a strided_gemm of at most 32 elements has one: "part-way" then means it never started).
"""

from __future__ import annotations

import numpy as np
import pytest

import rnngrad
from rnngrad.backends.metal import IncompleteDispatch, library
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal import completion
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.harness.contexts import emulated_device
from rnngrad.testing.cases import CELLS, random_case, random_descriptor

from draws import ALL_OPTIONAL, deferring_device, recurrence_kernel, threadgroups_of

pytestmark = [pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                 reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}"),
              pytest.mark.usefixtures("recurrence_version")]  # every test with v1 and v2


@pytest.fixture(params=["v1", "v2"])
def recurrence_version(request, monkeypatch):
    """conftest's, without v3: these tests expect a dispatch to run a range of steps; a stopped
    dispatch of v3's one-step grid is named by its step in
    test_metal_backend.py."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", request.param)
    return request.param


BACKEND = "metal-emulated"
SMALL_GROUPS = dict(max_threads_per_threadgroup=32)  # the products' and v1's


def small_groups() -> dict:
    """Threadgroups of 32 for v1 (two for _case's 36 threads); the v2 entries' own sizes."""
    return threadgroups_of(32)


def _case(cell, bidirectional=True, T=3):
    """D·N·H = 2·3·6 = 36 recurrence threads under v1: two threadgroups of 32, three rows each;
    under v2 six threadgroups, a row each."""
    rng = np.random.default_rng(len(cell) + 10 * bidirectional)
    fixed = dict(reset_after=True) if cell == "gru" else {}  # so that v2 runs under v2
    desc = random_descriptor(rng, cell, bidirectional=bidirectional, training=True, **fixed)
    return random_case(rng, cell, descriptor=desc, T=T, N=3, H=6, I=4, dtype=np.float32,
                       optional=ALL_OPTIONAL, cell_gradient_form="per_step")


def _dispatches(case):
    """[(kernel, op, threadgroups)] of the gradients call (a training forward, then the gradient
    op), fault-free."""
    with emulated_device(**small_groups()) as dev:
        case.training_forward(backend=BACKEND)
        forward = len(dev.trace)
        dev.trace.clear()
        case.gradients(backend=BACKEND)
    ops = [f"{case.cell}_forward"] * forward + [f"{case.cell}_gradients"] * (len(dev.trace) - forward)
    return [(d.kernel, op, d.threadgroups) for d, op in zip(dev.trace, ops)]


#: failure -> device options for dispatch i of a grid of g threadgroups. "Part-way": the first
#: half of the threadgroups run (none when there is only one).
FAILURES = {
    "stopped part-way": lambda i, g: dict(stop=(i, g // 2)),
    "never started": lambda i, g: dict(stop=(i, 0)),
    "timed out": lambda i, g: dict(timeout=i),
    "timed out part-way": lambda i, g: dict(stop=(i, g // 2), timeout=i),
}


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("failure", FAILURES)
def test_every_dispatch_of_every_op_raises_on_an_injected_failure(cell, failure):
    case = _case(cell)
    dispatches = _dispatches(case)
    assert {k for k, _, _ in dispatches} == {"strided_gemm", recurrence_kernel(case, "forward"),
                                             recurrence_kernel(case, "backward")}
    assert all(groups >= 2 for k, _, groups in dispatches if k != "strided_gemm"), dispatches
    size = "T=3, N=3, I=4, H=6, D=2"
    first = {}  # op -> index of its first dispatch
    for i, (_, op, _) in enumerate(dispatches):
        first.setdefault(op, i)
    for i, (kernel, op, groups) in enumerate(dispatches):
        with emulated_device(**small_groups(), **FAILURES[failure](i, groups)) as dev:
            with pytest.raises(IncompleteDispatch) as info:
                case.gradients(backend=BACKEND)
        err, message = info.value, str(info.value)
        assert isinstance(err, RuntimeError)
        assert (err.kernel, err.op, err.dispatch) == (kernel, op, i - first[op]), message
        assert f"{op}: kernel {kernel} did not finish" in message
        assert size in message and err.sizes == dict(T=3, N=3, I=4, H=6, D=2)
        assert "No result is returned" in message
        # The op stopped at the failed dispatch: nothing after it was opened.
        assert len(dev.trace) == i + 1 and dev.trace[-1].injected
        if kernel != "strided_gemm":
            assert err.steps == (0, 3) and "processing steps [0, 3) of T=3" in message
        else:
            assert err.steps is None
        if "timed out" in failure:
            assert err.reported == metalcompute.TIMEOUT_ERROR
            assert "Caused GPU Timeout Error" in message
        else:
            assert err.reported is None
        ran = groups // 2 if "part-way" in failure else (0 if failure == "never started" else groups)
        if ran == 0:
            assert "no threadgroup finished" in message
        elif ran < groups:
            assert err.missing == tuple(range(ran, groups))
            assert f"got none from threadgroup(s) {ran}" in message
        else:
            assert err.missing == ()


@pytest.mark.parametrize("cell", CELLS)
def test_fault_free_runs_and_injections_elsewhere_change_nothing(cell):
    """A failure injected past the op's last dispatch, or a stop that keeps every threadgroup,
    leaves the results bitwise as they are without injection."""
    case = _case(cell)
    with emulated_device(**small_groups()):
        want = case.gradients(backend=BACKEND)
    n = len(_dispatches(case)) + 10
    for options in (dict(stop=(n, 0), timeout=n), dict(stop=(2, 10 ** 6))):
        with emulated_device(**small_groups(), **options):
            got = case.gradients(backend=BACKEND)
        assert got.names == want.names
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("failure", FAILURES)
def test_an_op_that_did_not_wait_raises_at_the_next_call_or_synchronize(cell, failure,
                                                                      monkeypatch):
    """With RNNGRAD_LAUNCH_BLOCKING=0 on a device that checks marks itself (the CUDA target's
    way), an op returns without waiting; the same injected failures, at every dispatch, raise
    IncompleteDispatch at the next rnngrad call on the device (a failed forward: the gradient
    op, which then does not start) or at rnngrad.synchronize() (a failed gradient op), naming
    the op, the kernel and the dispatch, and saying it was found late."""
    monkeypatch.setenv(completion.LAUNCH_BLOCKING_ENV, "0")
    case = _case(cell)
    dispatches = _dispatches(case)
    first, count = {}, {}
    for i, (_, op, _) in enumerate(dispatches):
        first.setdefault(op, i)
        count[op] = count.get(op, 0) + 1
    for i, (kernel, op, groups) in enumerate(dispatches):
        device = deferring_device(**small_groups(), **FAILURES[failure](i, groups))
        with EMULATED_HOST.using(device), pytest.raises(IncompleteDispatch) as info:
            case.gradients(backend=BACKEND)
            rnngrad.synchronize()
        err, message = info.value, str(info.value)
        assert err.late and "Detected after the op had returned" in message
        assert (err.kernel, err.op, err.dispatch) == (kernel, op, i - first[op]), message
        assert err.sizes == dict(T=3, N=3, I=4, H=6, D=2)
        # the failed op ran to its end; the one after it did not start
        assert len(device.trace) == first[op] + count[op]
        if "timed out" in failure:
            assert err.reported == metalcompute.TIMEOUT_ERROR
        else:
            ran = groups // 2 if "part-way" in failure else 0
            assert err.missing == (ran,) and err.reported is None
    # nothing is left over: the next op on a healthy device runs
    with EMULATED_HOST.using(deferring_device(**small_groups())):
        got = case.gradients(backend=BACKEND)
        rnngrad.synchronize()
    with emulated_device(**small_groups()):
        want = case.gradients(backend=BACKEND)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


def test_a_failed_chunk_of_a_split_sequence_is_named_by_its_steps(monkeypatch):
    """T = 7 in dispatches of 3 steps: [0, 3), [3, 6), [6, 7) forward, the reverse backward."""
    case = _case("lstm", T=7)
    monkeypatch.setattr(EMULATED_HOST, "dispatch_budget", 3 * 1024 * 32)  # units: 1024·max(24, 32)
    with emulated_device(**small_groups()) as dev:
        case.gradients(backend=BACKEND)
    kernels = [d.kernel for d in dev.trace]
    forward = [i for i, k in enumerate(kernels) if k == recurrence_kernel(case, "forward")]
    backward = [i for i, k in enumerate(kernels) if k == recurrence_kernel(case, "backward")]
    assert len(forward) == len(backward) == 3
    for index, steps in ((forward[1], (3, 6)), (backward[0], (6, 7)), (backward[2], (0, 3))):
        with emulated_device(**small_groups(), stop=(index, 1)):
            with pytest.raises(IncompleteDispatch) as info:
                case.gradients(backend=BACKEND)
        assert info.value.steps == steps
        assert f"processing steps [{steps[0]}, {steps[1]}) of T=7" in str(info.value)
        assert "RNNGRAD_METAL_DISPATCH_BUDGET" in str(info.value)


class _FinishingDevice(metalcompute.Device):
    """A harness device that, like the CUDA target, waits on several runs itself (finish)."""

    def finish(self, handles):
        del handles[:]


@pytest.mark.parametrize("cell", CELLS)
def test_a_device_with_finish_gets_the_op_back_to_back_and_the_first_failure_named(cell):
    """With device.finish (the CUDA target's API) the host opens every dispatch of the op before
    it checks the marks, in order: a failed dispatch is still the one named."""
    case = _case(cell)
    dispatches = _dispatches(case)
    forward = sum(op.endswith("_forward") for _, op, _ in dispatches)
    for i, (kernel, op, groups) in enumerate(dispatches):
        device = _FinishingDevice(**small_groups(), stop=(i, groups // 2))
        with EMULATED_HOST.using(device), pytest.raises(IncompleteDispatch) as info:
            case.gradients(backend=BACKEND)
        assert (info.value.kernel, info.value.op) == (kernel, op)
        # The op that failed ran to its last dispatch; the gradient op never started after a
        # failed forward.
        assert len(device.trace) == (forward if i < forward else len(dispatches))
    with EMULATED_HOST.using(_FinishingDevice(**small_groups())) as device:
        got = case.gradients(backend=BACKEND)
    with emulated_device(**small_groups()):
        want = case.gradients(backend=BACKEND)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


# -- at the level of metalcompute's API ---------------------------------------------------------

def _gemm_call(dev, count=100):
    """C[1,count,1] = A·B with K = 3 through strided_gemm; (C, status, handle)."""
    fn = dev.kernel(library.source()).function("strided_gemm")
    params = np.zeros(1, library.GEMM_PARAMS)
    for key, value in dict(count=count, batch=1, M=count, P=1, K=3, a_row=3, a_k=1, b_k=1,
                           b_col=1, block=count).items():
        params[key] = value
    A = dev.buffer(np.ones(3 * count, np.float32))
    B = dev.buffer(np.ones(3, np.float32))
    C = dev.buffer(4 * count)
    status = dev.buffer(np.zeros(2 * -(-count // 32), np.uint32))
    handle = fn(count, dev.buffer(params.view(np.uint8)), A, B, dev.buffer(4), C, status)
    out = np.frombuffer(C, np.float32).copy()
    marks = np.frombuffer(status, np.uint32).reshape(-1, 2).copy()
    return out, marks, handle


def test_a_stopped_dispatch_leaves_partial_output_that_only_the_marks_reveal():
    """What the host guards against: the call returns normally with some outputs unwritten."""
    out, marks, handle = _gemm_call(metalcompute.Device(**SMALL_GROUPS))
    assert (out == 3).all() and handle.error is None
    assert (marks[:, 0] == library.DONE | 3).all() and (marks[:, 1] == 32).all()

    dev = metalcompute.Device(**SMALL_GROUPS, stop=(0, 2))
    out, marks, handle = _gemm_call(dev)
    assert handle.error is None  # nothing reported, as with metalcompute on a Mac
    assert (out[:64] == 3).all() and (out[64:] == 0).all()
    assert (marks[:2, 0] == library.DONE | 3).all() and (marks[2:] == 0).all()
    assert dev.trace[-1].threadgroups == 4
    assert dev.trace[-1].injected == "stopped after 2 of 4 threadgroups"

    dev = metalcompute.Device(timeout=0)
    out, marks, handle = _gemm_call(dev)
    assert handle.error == metalcompute.TIMEOUT_ERROR and dev.trace[-1].injected == "reported a timeout"
    assert _gemm_call(dev)[2].error is None  # only the dispatch chosen


@pytest.mark.parametrize("options, message", [
    (dict(stop=3), "stop: expected (dispatch number, threadgroups that run)"),
    (dict(stop=(0, -1)), "got (0, -1)"),
    (dict(timeout=-2), "timeout: expected a dispatch number, an int >= 0, got -2"),
    (dict(timeout="0"), "got '0'"),
])
def test_injection_options_say_what_was_expected(options, message):
    with pytest.raises(metalcompute.error, match=message.replace("(", r"\(").replace(")", r"\)")):
        metalcompute.Device(**options)


def _marks(groups, extra=0, size=64, steps=7):
    """Status words of a dispatch of ``groups`` threadgroups of ``size``, every one marked done
    with ``steps``, and ``extra`` zeroed entries past them."""
    words = np.zeros((groups + extra, 2), np.uint32)
    words[:groups] = (library.DONE | steps, size)
    return words


@pytest.mark.parametrize("edit, expected", [
    (None, None),
    (lambda w: w.__setitem__((3, 0), library.DONE | 6),
     "expected marks of 7 steps, got [6] from threadgroup(s) 3"),
    (lambda w: w.__setitem__(5, (library.DONE | 7, 64)),
     "expected no mark past threadgroup 4, got marks from 5"),
    (lambda w: w.__setitem__((2, 1), 32), "expected one threadgroup size of at least 32 in the "
                                          "marks, got [32, 64]"),
    (lambda w: w.__setitem__(1, (0, 0)), "got none from threadgroup(s) 1"),
    (lambda w: w.__setitem__(slice(None), 0), "got none (no threadgroup finished)"),
])
def test_each_kind_of_wrong_mark_is_named(edit, expected):
    """The completion check on crafted status words: 5 threadgroups of 64 threads (320 threads)
    asked for 7 steps. Correct marks pass; a wrong step count, a mark past the grid, two sizes,
    a missing mark and no mark at all are each named."""
    case = random_case(0, "lstm", T=3, N=2, H=4, I=3, dtype=np.float32)
    from rnngrad.validation import forward_problem

    problem = forward_problem("lstm", case.descriptor, **case.inputs)[0]
    runs = completion.Runs(EMULATED_HOST, "lstm_forward", problem)
    words = _marks(5, extra=3)
    if edit is not None:
        edit(words)
    check = dict(kernel="lstm_forward", count=320, status=None, marks=8, steps=7, span=(0, 3),
                 number=0, reported=None, words=words)
    if expected is None:
        runs._check(**check)
        return
    with pytest.raises(IncompleteDispatch) as info:
        runs._check(**check)
    assert expected in str(info.value), str(info.value)
    with pytest.raises(IncompleteDispatch, match="the device reported: a fault"):
        runs._check(**dict(check, words=_marks(5, extra=3), reported="a fault"))


def test_marks_cover_every_kernel_and_sit_in_the_last_binding():
    for kernel, names in library.BUFFERS.items():
        assert names[-1] == "status", kernel


# -- on the harness's CUDA target ----------------------------------------------------------------

def _cuda_unavailable():
    try:
        from rnngrad.backends.metal import cuda
    except ImportError as exc:
        return str(exc)
    return cuda.available()


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_unavailable() is not None,
                    reason=f"needs an NVIDIA GPU with CuPy: {_cuda_unavailable()}")
@pytest.mark.parametrize("cell", CELLS)
def test_cuda_target_dispatch_launched_with_half_its_grid_raises(cell, monkeypatch):
    """The CUDA target has no injection option: dispatch i launches only the first half of its
    grid's threadgroups (none when it has one) by wrapping the target's one launch function,
    which its calls and prepared calls (the host's) both go through."""
    from rnngrad.backends.metal import cuda
    from rnngrad.backends.metal.harness.contexts import cuda_device

    case = _case(cell)
    with cuda_device() as dev:
        case.gradients(backend="metal-cuda")
    kernels = [d.kernel for d in dev.trace]
    launch = cuda._launch_params

    for i, kernel in enumerate(kernels):
        calls = [0]

        def stopped(function, n_tg, tg, stream, params):
            number, calls[0] = calls[0], calls[0] + 1
            if number == i:
                return None if n_tg < 2 else launch(function, n_tg // 2, tg, stream, params)
            return launch(function, n_tg, tg, stream, params)

        monkeypatch.setattr(cuda, "_launch_params", stopped)
        with cuda_device(), pytest.raises(IncompleteDispatch) as info:
            case.gradients(backend="metal-cuda")
        monkeypatch.setattr(cuda, "_launch_params", launch)
        assert calls[0] > i  # dispatch i was launched (the op that has it raises)
        assert info.value.kernel == kernel, (i, str(info.value))
