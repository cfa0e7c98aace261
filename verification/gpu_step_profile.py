"""One eager training step through ``rnngrad.torch`` on CUDA under torch.profiler: whether the host
runs ahead of the GPU (no synchronisation inside rnngrad's ops), on the GPU machine.

A Linear + ``rt.LSTM`` + Linear model, a few steps without any wait between them (no ``.item()``),
then one ``torch.cuda.synchronize()``. Printed: the CUDA API calls that wait for the device
(``*Synchronize``, device-to-host copies) made inside the steps, by name; the host's time to
issue the steps against the time until the GPU finished them; the GPU's busy share over that
span. A Chrome trace of the steps goes to ``--out`` (open it in Perfetto: the CPU rows end
long before the GPU row).

    python verification/gpu_step_profile.py [--shape 100x32x256x256] [--steps 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: CUDA API calls that make the host wait for the device
WAITS = re.compile(r"Synchronize|^cudaMemcpy$|^cuMemcpy(DtoH)?(_v2)?$")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="100x32x256x256")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    T, N, I, H = (int(v) for v in args.shape.lower().split("x"))

    import torch

    import rnngrad
    import rnngrad.torch as rt

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.lstm, self.tail = torch.nn.Linear(I, I), rt.LSTM(I, H), torch.nn.Linear(H, 1)

        def forward(self, x):
            return self.tail(self.lstm(self.head(x))[0])

    torch.manual_seed(0)
    model = Model().cuda()
    x = torch.randn(T, N, I, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    rnngrad.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        issued = time.perf_counter() - start
        torch.cuda.synchronize()
        done = time.perf_counter() - start
    rnngrad.synchronize()
    prof.export_chrome_trace(os.path.join(args.out, "step-trace.json"))
    waits, busy = {}, 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            busy += e.time_range.elapsed_us()
        elif WAITS.search(e.name) and e.name != "cudaDeviceSynchronize":  # the one at the end
            waits[e.name] = waits.get(e.name, 0) + 1
    print(f"LSTM {args.shape}, {args.steps} eager training steps (Linear + rt.LSTM + Linear, SGD)")
    print(f"host issued them in {issued * 1e3:.2f} ms; the GPU finished at {done * 1e3:.2f} ms "
          f"(host {issued / done:.0%} of the span); GPU kernels busy {busy / 1e3:.2f} ms")
    print("CUDA calls inside the steps that wait for the device:",
          ", ".join(f"{k} ×{v}" for k, v in sorted(waits.items())) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
