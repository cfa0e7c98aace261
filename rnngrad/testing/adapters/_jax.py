"""What the jax adapters share: a layer of the array protocol whose forward is a jax function,
its gradients ``jax.vjp`` of that forward, compiled once per configuration and shape.

An adapter gives a :class:`JaxLayer` two jax-traceable functions: ``to_framework(params)``
(rnngrad-named parameters → the framework's own, the one mapping, inside the differentiated
function so that the gradients come back in rnngrad's names) and ``build(dtype)``, which makes
the framework's layer in that dtype (frameworks fix a layer's dtype when they build it) and
returns ``forward(own, x, h0, c0, lengths)`` → (output, h_n, c_n) in the protocol's layouts. Compiled functions are kept per
(adapter, configuration) and jax keeps one program per shape; :func:`after_problem` clears
them all once the process holds too many memory maps (each compiled program keeps some).
"""

from __future__ import annotations

import os

import numpy as np

from ...descriptors import LSTMDescriptor

_COMPILED = {}
#: memory maps past which the compiled programs are dropped (the system's limit is near 65530)
MAP_BUDGET = 20000


def enable_x64():
    """float64 in jax (off by default there); float32 arrays stay float32."""
    import jax

    jax.config.update("jax_enable_x64", True)


def memory_maps() -> int:
    """Lines of /proc/self/maps (0 where there is none)."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def after_problem():
    """Drop every compiled program once the process's memory maps pass :data:`MAP_BUDGET`."""
    if memory_maps() > MAP_BUDGET:
        clear()


def clear():
    """Drop the compiled functions and jax's caches."""
    import jax

    _COMPILED.clear()
    jax.clear_caches()


def zero_padded(output, lengths, batch_first):
    """The output with the steps past each sequence's length set to zero."""
    import jax.numpy as jnp

    if lengths is None:
        return output
    T = output.shape[1] if batch_first else output.shape[0]
    alive = jnp.arange(T)[:, None] < lengths[None, :]  # [T,N]
    alive = alive.T if batch_first else alive
    return jnp.where(alive[..., None], output, jnp.zeros((), output.dtype))


class JaxAdapter:
    """What a jax adapter's factory shares: the per-problem hook."""

    def after_problem(self):
        after_problem()


class JaxLayer:
    """An array layer (:mod:`rnngrad.testing.arrays`) computed by jax."""

    def __init__(self, key, descriptor, parameter_names, to_framework, build, *, batch_first,
                 gate_names=None):
        self.key, self.batch_first, self.gate_names = key, batch_first, gate_names
        self.descriptor = descriptor
        self.parameter_names = tuple(parameter_names)
        self._to_framework, self._build = to_framework, build

    def framework_parameters(self, params):
        return {k: np.asarray(v) for k, v in self._to_framework(params).items()}

    def _compiled(self, dtype):
        key = self.key + (np.dtype(dtype).name,)
        if key not in _COMPILED:
            import jax

            to_framework, forward = self._to_framework, self._build(np.dtype(dtype))

            def run(params, x, h0, c0, lengths, cotangents):
                def fn(params, x, h0, c0):
                    return forward(to_framework(params), x, h0, c0, lengths)

                out, pull = jax.vjp(fn, params, x, h0, c0)
                return out, pull(tuple(None if o is None else c for o, c in zip(out, cotangents)))

            _COMPILED[key] = (jax.jit(run), jax.jit(
                lambda params, x, h0, c0, lengths: forward(to_framework(params), x, h0, c0, lengths)))
        return _COMPILED[key]

    def run(self, params, x, *, h0=None, c0=None, lengths=None, cotangents=None):
        with_vjp, plain = self._compiled(x.dtype)
        if cotangents is None:
            y, hn, cn = plain(params, x, h0, c0, lengths)
            return {"output": y, "h_n": hn, "c_n": cn}
        # zeros for the quantities outside the loss: one program serves every loss
        H = params["recurrent_weight_l0"].shape[1]
        D = 2 if "recurrent_weight_l0_reverse" in params else 1
        state = (D, H) if x.ndim == 2 else (D, x.shape[0 if self.batch_first else 1], H)
        shapes = (x.shape[:-1] + (D * H,), state,
                  state if isinstance(self.descriptor, LSTMDescriptor) else None)
        cot = tuple(None if s is None else (np.zeros(s, x.dtype) if c is None else c)
                    for s, c in zip(shapes, (cotangents.get(k) for k in ("output", "h_n", "c_n"))))
        (y, hn, cn), (dp, dx, dh0, dc0) = with_vjp(params, x, h0, c0, lengths, cot)
        return {"output": y, "h_n": hn, "c_n": cn, "input": dx, "h_0": dh0, "c_0": dc0,
                "params": dp}
