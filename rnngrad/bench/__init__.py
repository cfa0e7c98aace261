"""Benchmark logic of ``rnngrad bench``: each implementation is timed in a worker process of
its own (:mod:`rnngrad.bench.worker`), in alternating passes, so that the thread pools of
PyTorch, OpenBLAS and numba never share a process."""
