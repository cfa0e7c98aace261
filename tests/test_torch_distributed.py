"""Training beyond one process is PyTorch's own: two ``torch.distributed`` processes (gloo, on
the loopback address) with ``DistributedDataParallel`` around an ``rnngrad.torch.LSTM``, each
on half of a batch, end with the parameter gradients of one process on the whole batch, the
all-reduce of a layer's gradients under way while the layers below run backward; the same
over NCCL with one process per GPU around a two-layer LSTM on CUDA tensors (``metal-cuda``),
a ``gpu`` test that needs two GPUs."""

import os
import time

import numpy as np
import pytest

from rnngrad.testing import compare_array

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import rnngrad.torch as rt  # noqa: E402

WORLD = 2
T, N, I, H = 6, 4, 3, 5
#: seconds the two processes may take, start-up included
TIMEOUT = 120
#: the same on GPUs, where each process also loads the compiled kernels and NCCL starts
TIMEOUT_NCCL = 300

QUANTITY = {"weight_ih": "input_weight", "weight_hh": "recurrent_weight", "bias_ih": "bias",
            "bias_hh": "bias", "head.weight": "input_weight", "head.bias": "bias"}


class Model(torch.nn.Module):
    """A bidirectional two-layer rnngrad LSTM and a linear head on its last output."""

    def __init__(self):
        super().__init__()
        self.lstm = rt.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True,
                            dtype=torch.float64, backend="reference")
        self.head = torch.nn.Linear(2 * H, 1, dtype=torch.float64)

    def forward(self, x):
        output, _ = self.lstm(x)
        return self.head(output[:, -1])


def _setup():
    torch.manual_seed(0)
    model = Model()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, T, I, generator=g, dtype=torch.float64)
    y = torch.randn(N, 1, generator=g, dtype=torch.float64)
    return model, x, y


def _gradients(model) -> dict:
    return {k.replace("module.", ""): p.grad.detach().numpy().copy()
            for k, p in model.named_parameters()}


def _gloo(rank, folder, work):
    """``work()`` in rank ``rank`` of a gloo group of WORLD processes on the loopback device,
    then a barrier, and the process's exit."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the loopback device only
    # rendezvous through a file: no port to pick beforehand (and none to race for)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'rendezvous')}",
                            rank=rank, world_size=WORLD)
    try:
        work()
        dist.barrier()  # both ranks past their last collective
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave without tearing gloo down: destroy_process_group (or the interpreter's exit, which
    # runs gloo's destructors) can abort in gloo's threads with "terminate called without an
    # active exception", even after a barrier (one run in three here). The results are on disk;
    # os._exit skips the destructors and exits with status 0.
    os._exit(0)


def _rank(rank, folder):
    def work():
        model, x, y = _setup()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        part = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        loss = torch.nn.functional.mse_loss(ddp(x[part]), y[part])  # DDP averages the gradients
        loss.backward()
        np.savez(os.path.join(folder, f"rank{rank}.npz"), **_gradients(ddp))
    _gloo(rank, folder, work)


def _run_ranks(rank, tmp_path, timeout=TIMEOUT):
    """Run ``rank(i, folder)`` in WORLD spawned processes and wait for them, at most ``timeout``
    seconds (then fail, with what each process logged to ``rank<i>.log``); a process still
    alive afterwards is killed."""
    context = mp.start_processes(rank, args=(str(tmp_path),), nprocs=WORLD,
                                 join=False, start_method="spawn")
    try:
        deadline = timeout
        while not context.join(timeout=5):
            deadline -= 5
            if deadline <= 0:
                logs = {i: (tmp_path / f"rank{i}.log").read_text()
                        if (tmp_path / f"rank{i}.log").exists() else "nothing logged"
                        for i in range(WORLD)}
                pytest.fail(f"the {WORLD} processes did not finish in {timeout} s; their "
                            f"logs: {logs}")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def test_two_gloo_processes_with_ddp_give_the_whole_batch_gradients(tmp_path):
    _run_ranks(_rank, tmp_path)

    model, x, y = _setup()
    torch.nn.functional.mse_loss(model(x), y).backward()
    _assert_ranks_have(tmp_path, _gradients(model), np.float64)


def _overlap_rank(rank, folder):
    """DDP steps with a bucket per parameter, logging in order, in the second step, when each
    parameter's gradient is ready, when DDP hands each bucket to its all-reduce (a comm hook)
    and when the autograd node that gives the bottom layer's gradients starts (a prehook)."""
    import json

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def work():
        model, x, y = _setup()
        names = {p: n for n, p in model.named_parameters()}
        events = []
        for p, n in names.items():
            p.register_post_accumulate_grad_hook(lambda p, n=n: events.append(["ready", n]))
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1e-6)

        def hook(state, bucket):
            events.append(["all-reduce", [names[p] for p in bucket.parameters()]])
            return default_hooks.allreduce_hook(state, bucket)
        ddp.register_comm_hook(None, hook)
        part = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        bottom = [p for p, n in names.items() if "lstm" in n and "_l0" in n]
        # DDP's first step runs one bucket and then rebuilds them in the order the gradients
        # came: the second step is the one a training loop repeats
        for _ in range(2):
            events.clear()
            ddp.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(ddp(x[part]), y[part])
            for node in _nodes_giving(loss, bottom):
                node.register_prehook(lambda grads: events.append(["bottom backward", ""]))
            loss.backward()
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump(events, f)
        np.savez(os.path.join(folder, f"rank{rank}.npz"), **_gradients(ddp))
    _gloo(rank, folder, work)


def _nodes_giving(loss, params):
    """The autograd nodes of ``loss``'s graph that give a gradient of one of ``params``."""
    wanted = {id(p) for p in params}
    found, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nexts = [f for f, _ in node.next_functions if f is not None]
        if any(id(getattr(f, "variable", None)) in wanted for f in nexts):
            found.append(node)
        todo.extend(nexts)
    return found


def test_ddp_all_reduces_the_top_layers_gradients_while_the_bottom_layer_runs_backward(tmp_path):
    """Each layer of an rnngrad.torch stack is an autograd node of its own, so DDP hands the
    top layer's gradients to their all-reduce before the bottom layer's backward has given its
    own (the overlap torch.nn's one-node cuDNN stack cannot have inside the stack); the
    gradients are still the whole batch's."""
    import json

    _run_ranks(_overlap_rank, tmp_path)
    model, x, y = _setup()
    torch.nn.functional.mse_loss(model(x), y).backward()
    _assert_ranks_have(tmp_path, _gradients(model), np.float64)
    for rank in range(WORLD):
        events = json.loads((tmp_path / f"rank{rank}.json").read_text())
        bottom = [i for i, (kind, _) in enumerate(events) if kind == "bottom backward"]
        top = [i for i, (kind, what) in enumerate(events)
               if kind == "all-reduce" and any("lstm" in n and "_l1" in n for n in what)]
        assert bottom and top, events
        assert min(top) < min(bottom), events  # under way before the bottom layer's backward


def _assert_ranks_have(folder, want: dict, dtype):
    """Each rank's saved gradients (``rank<i>.npz``) equal ``want`` within ``dtype``'s
    tolerance for each parameter's quantity."""
    for rank in range(WORLD):
        with np.load(folder / f"rank{rank}.npz") as got:
            assert set(got.files) == set(want)
            for name, value in want.items():
                kind = QUANTITY[name] if name in QUANTITY else QUANTITY[name.split("_l")[0].split(".")[-1]]
                ratio, mismatch = compare_array(kind, got[name], value, dtype)
                print(f"rank {rank} {name}: worst error {ratio:.3g} of the {np.dtype(dtype)} tolerance")
                assert mismatch is None, f"rank {rank}, {name}: {mismatch}"


# -- NCCL: one process per GPU ----------------------------------------------------------------

def _two_gpus() -> bool:
    import rnngrad

    return (torch.cuda.is_available() and torch.cuda.device_count() >= 2
            and dist.is_nccl_available() and rt.CUDA_BACKEND in rnngrad.available_backends())


class CudaModel(torch.nn.Module):
    """A two-layer rnngrad LSTM on metal-cuda (float32) and a linear head on its last output."""

    def __init__(self, device):
        super().__init__()
        self.lstm = rt.LSTM(I, H, num_layers=2, batch_first=True, device=device)
        self.head = torch.nn.Linear(H, 1, device=device)

    def forward(self, x):
        output, _ = self.lstm(x)
        return self.head(output[:, -1])


def _cuda_setup(device):
    torch.manual_seed(0)
    model = CudaModel(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, T, I, generator=g).to(device)
    y = torch.randn(N, 1, generator=g).to(device)
    return model, x, y


def _nccl_rank(rank, folder):
    start = time.perf_counter()

    def log(stage):
        with open(os.path.join(folder, f"rank{rank}.log"), "a") as f:
            f.write(f"{stage} at {time.perf_counter() - start:.1f} s; ")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{os.path.join(folder, 'rendezvous')}",
                            rank=rank, world_size=WORLD)
    log("process group")
    try:
        model, x, y = _cuda_setup(torch.device("cuda", rank))
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        log("model")
        part = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        loss = torch.nn.functional.mse_loss(ddp(x[part]), y[part])
        log("forward")
        loss.backward()
        log("backward")
        grads = {k.replace("module.", ""): p.grad.detach().cpu().numpy().copy()
                 for k, p in ddp.named_parameters()}
        np.savez(os.path.join(folder, f"rank{rank}.npz"), **grads)
        dist.barrier()
        log("saved")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 CUDA GPUs, NCCL and the metal-cuda backend")
def test_two_nccl_processes_with_ddp_on_two_gpus_give_the_whole_batch_gradients(tmp_path):
    # the whole batch in this process first: the kernels it compiles are on disk (CuPy's kernel
    # cache) when the two processes load them
    model, x, y = _cuda_setup(torch.device("cuda", 0))
    torch.nn.functional.mse_loss(model(x), y).backward()
    want = {k: p.grad.detach().cpu().numpy() for k, p in model.named_parameters()}
    _run_ranks(_nccl_rank, tmp_path, TIMEOUT_NCCL)
    print(f"logs: {[(tmp_path / f'rank{i}.log').read_text() for i in range(WORLD)]}")
    _assert_ranks_have(tmp_path, want, np.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 CUDA GPUs, NCCL and the metal-cuda backend")
def test_a_layer_on_the_second_gpu_runs_there_and_gives_the_first_gpus_results():
    """metal-cuda runs an op on the device its tensors are on, whichever device is current."""
    results = []
    for index in (0, 1):
        model, x, y = _cuda_setup(torch.device("cuda", index))
        out = model(x)
        torch.nn.functional.mse_loss(out, y).backward()
        assert out.device.index == index
        results.append([out.detach().cpu()] + [p.grad.cpu() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
