"""Fuzzing whole framework RNN layers (``torch.nn.RNN`` / ``GRU`` / ``LSTM`` and anything built
like them) against rnngrad's float64 reference, composed layer by layer.

The bugs users of framework RNNs hit are mostly in the layer around the recurrent op: the
``batch_first`` transposes, the per-layer slices of ``h_0`` / ``c_0``, the two biases summed,
dropout between layers, the packing of variable-length batches, a cache keyed by configuration.
:func:`check_module` builds layers through a ``factory`` with ``torch.nn``'s constructor
keywords, sets their parameters to drawn values, runs forward and backward on a device and
compares every quantity with the reference:

- the output, ``h_n`` and ``c_n``; the gradients of the input, ``h_0``, ``c_0`` and of every
  parameter by its ``torch.nn`` name (``weight_hh_l1_reverse``), for a loss on the output only,
  on the final states only, or on both (``Σ g ⊙ output + Σ g_h ⊙ h_n + Σ g_c ⊙ c_n``);
- the reference of layer ``k`` is the rnngrad op of ``torch.nn``'s cell
  (:mod:`rnngrad.convert.torch`) fed by layer ``k − 1``'s output and the ``k``-th slices
  ``h_0[k·D:(k+1)·D]``; a packed batch is the reference run on each sequence alone, over its
  own length (padding zero in the output and in the input gradient);
- dropout: in eval mode, none (the reference); in train mode, the layer's gradients against
  central differences of its own loss, with the random generator reseeded before every
  evaluation so that the masks stay fixed; and the sequence train → eval → train, whose eval
  must give a fresh layer's results and whose second train run the first's.

Problems are :class:`Problem`\\ s: a configuration, the input form (batched, unbatched,
non-contiguous, ``PackedSequence`` with unsorted lengths), the initial states (absent, zero,
random), the loss, the mode, the dtype and a seed for the values. A fixed set
(:data:`SCENARIOS`: one per fault class framework layers have shipped, and one problem whose
input holds more than 2¹⁶ elements) runs first, then hypothesis draws, shrinking a failure to
the smallest problem that still fails. Values are contractive (weights of norm about 0.5), so
every gradient is informative in float32, unless ``values=`` asks for saturating or non-finite
ones. The problems and scenarios are :mod:`rnngrad.testing.layer_problems`'s, the composed
reference :mod:`rnngrad.testing.layer_reference`'s; a layer of another framework comes in
through :mod:`rnngrad.testing.arrays`.

torch is imported only when a torch layer is checked, so ``rnngrad.testing`` imports without
it, and array layers are checked without it.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .check import Unsupported, fuzz_draws
from .compare import compare_array
from .arrays import is_array_layer, locator, rnngrad_layer, run_layer
from .layer_problems import (CELLS, FORMS, LOSSES, MODES, STATES, VALUES, Capabilities,  # noqa: F401
                             Problem, problem_values, problems, scenarios)
from .layer_reference import reference, torch_layer  # noqa: F401
# a quantity's tolerance kind (rnngrad.testing.compare) by a stand-in name compare_array knows
_PROXY = {"output": "state", "state": "source", "parameter": "recurrent_weight"}


class ModuleMismatch(AssertionError):
    """A layer differs from the reference (or raised). ``problem``: the (shrunk) :class:`Problem`;
    ``mismatches``: [:class:`rnngrad.testing.compare.Mismatch`] with the layer's quantity names;
    ``examples``: problems checked when the first failing one was met."""

    def __init__(self, message, *, problem, mismatches=()):
        super().__init__(message)
        self.problem, self.mismatches, self.examples = problem, list(mismatches), None


# -- the layer under test ---------------------------------------------------------------------

def _make(factory, problem):
    """The factory's layer for the problem's configuration (Unsupported when it declines)."""
    try:
        return factory(**problem.config())
    except (ValueError, NotImplementedError) as exc:
        raise Unsupported(f"factory raised {type(exc).__name__}: {exc}") from exc


def _build(factory, problem, device, values, module=None):
    """The factory's layer on ``device`` in the problem's dtype, its parameters set."""
    import torch

    module = _make(factory, problem) if module is None else module
    module = module.to(device=device, dtype=getattr(torch, problem.dtype))
    names = [n for n, _ in module.named_parameters()]
    if sorted(names) != sorted(values["params"]):
        raise AssertionError(f"parameters: expected torch.nn's names {sorted(values['params'])}, "
                             f"got {sorted(names)}")
    with torch.no_grad():
        for name, p in module.named_parameters():
            want = values["params"][name]
            if tuple(p.shape) != want.shape:
                raise AssertionError(f"{name}: expected shape {want.shape}, got {tuple(p.shape)}")
            p.copy_(torch.as_tensor(want, dtype=p.dtype))
    return module


def _tensor(a, problem, device):
    import torch

    return torch.as_tensor(np.ascontiguousarray(a), dtype=getattr(torch, problem.dtype)).to(device)


def _in_layout(a, problem):
    """A time-major [T,N,·] array in the layer's layout: [N,T,·] batch-first, [T,·] unbatched."""
    if problem.form == "unbatched":
        return a[:, 0]
    return a.transpose(1, 0, 2) if problem.batch_first else a


def _from_layout(a, problem):
    if problem.form == "unbatched":
        return a[:, None]
    return a.transpose(1, 0, 2) if problem.batch_first else a


def _states_layout(a, problem):
    return a[:, 0] if problem.form == "unbatched" else a


def _run(module, problem, values, device, seed=None):
    """Forward and backward of the layer: {quantity: float64 array, time-major} or raises."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    v = values
    x_np = _in_layout(v["x"], problem)
    if problem.form == "noncontiguous":  # every other element of a wider buffer
        wide = torch.zeros(x_np.shape[:-1] + (2 * x_np.shape[-1],), dtype=getattr(torch, problem.dtype),
                           device=device)
        x = wide[..., ::2].detach()
        with torch.no_grad():
            x.copy_(_tensor(x_np, problem, device))
    else:
        x = _tensor(x_np, problem, device)
    x.requires_grad_(True)
    leaves = {"input": x}
    hx = None
    if v["h0"] is not None:
        leaves["h_0"] = _tensor(_states_layout(v["h0"], problem), problem, device).requires_grad_(True)
        hx = leaves["h_0"]
        if v["c0"] is not None:
            leaves["c_0"] = _tensor(_states_layout(v["c0"], problem), problem, device).requires_grad_(True)
            hx = (leaves["h_0"], leaves["c_0"])
    inp = x
    if problem.form == "packed":
        inp = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(problem.lengths),
                                                      batch_first=problem.batch_first,
                                                      enforce_sorted=False)
    try:
        out, hn = module(inp, hx)
    except NotImplementedError as exc:
        raise Unsupported(f"the layer raised NotImplementedError: {exc}") from exc
    if problem.form == "packed":
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=problem.batch_first,
                                                        total_length=problem.T)
    cn = None
    if problem.cell == "lstm":
        hn, cn = hn
    terms = []  # only what the loss names: a loss on the final states never touches output
    if v["gy"] is not None:
        terms.append((out * _tensor(_in_layout(v["gy"], problem), problem, device)).sum())
    if v["ghn"] is not None:
        terms.append((hn * _tensor(_states_layout(v["ghn"], problem), problem, device)).sum())
    if v["gcn"] is not None:
        terms.append((cn * _tensor(_states_layout(v["gcn"], problem), problem, device)).sum())
    loss = sum(terms[1:], terms[0])
    params = dict(module.named_parameters())
    for p in params.values():
        p.grad = None
    loss.backward()
    numpy = lambda t: None if t is None else t.detach().to("cpu", torch.float64).numpy()  # noqa: E731

    def stacked(t):  # [L·D,N,H]: unbatched states gain their batch axis
        if t is None:
            return None
        return numpy(t)[:, None] if problem.form == "unbatched" else numpy(t)

    got = {"output": _from_layout(numpy(out), problem), "h_n": stacked(hn), "c_n": stacked(cn),
           "loss": float(loss.detach().to("cpu", torch.float64))}
    for name, leaf in leaves.items():
        g = leaf.grad
        if g is not None:
            g = stacked(g) if name != "input" else _from_layout(numpy(g), problem)
        got[name] = g
    got["params"] = {name: numpy(p.grad) for name, p in params.items()}
    return got


def _loss_only(module, problem, values, device, seed, shifts):
    """The layer's loss at parameters + shifts (and input + shift), the generator reseeded."""
    import torch

    with torch.no_grad():
        saved = {n: p.detach().clone() for n, p in module.named_parameters()}
        for n, p in module.named_parameters():
            if n in shifts:
                p.add_(torch.as_tensor(shifts[n], dtype=p.dtype, device=p.device))
    try:
        shifted = dict(values)
        for key, name in (("x", "input"), ("h0", "h_0"), ("c0", "c_0")):
            if name in shifts:
                shifted[key] = values[key] + shifts[name]
        with torch.enable_grad():
            return _run(module, problem, shifted, device, seed=seed)["loss"]
    finally:
        with torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(saved[n])


# -- comparison -------------------------------------------------------------------------------

def _label(name):
    return {"output": "output", "h_n": "h_n", "c_n": "c_n", "input": "input gradient",
            "h_0": "h_0 gradient", "c_0": "c_0 gradient"}.get(name, f"`{name}` gradient")


def _kind(name):
    if name in ("output", "h_n", "c_n"):
        return "output"
    return "state" if name in ("input", "h_0", "c_0") else "parameter"


def _user_layout(name, a, problem):
    """A time-major quantity in the layer's own layout (batch-first, unbatched), so that a
    mismatch's index addresses the user's tensor."""
    if a is None or problem is None:
        return a
    if name in ("output", "input"):
        return _in_layout(a, problem)
    return _states_layout(a, problem) if name in ("h_n", "c_n", "h_0", "c_0") else a


def _layout_words(name, problem):
    if problem is None or name not in ("output", "input", "h_n", "c_n", "h_0", "c_0"):
        return ""
    width = "I" if name == "input" else "D·H"
    if name in ("output", "input"):
        if problem.form == "unbatched":
            return f" [T,{width}]"
        return f" [N,T,{width}]" if problem.batch_first else f" [T,N,{width}]"
    return " [L·D,H]" if problem.form == "unbatched" else " [L·D,N,H]"


def compare_runs(got, want, dtype, *, against="reference", problem=None, locate=None) -> list:
    """[Mismatch] between a layer's run and the reference (or another run), each quantity under
    rnngrad's tolerance for its kind; a missing gradient is a mismatch. With ``problem``, the
    indices are in the layer's own layout; ``locate(name, index)`` adds where a parameter's
    element is in the framework's own parameters."""
    from .compare import Mismatch

    mismatches = []
    pairs = [(k, got.get(k), want.get(k)) for k in ("output", "h_n", "c_n", "input", "h_0", "c_0")]
    pairs += [(k, got["params"].get(k), want["params"][k]) for k in want["params"]]
    for name, g, w in pairs:
        label = _label(name)
        if w is None:
            continue
        if g is None:
            mismatches.append(Mismatch(label, (), np.nan, np.nan, 0.0, 0.0, 0.0, "missing",
                                       f"none computed, {against} has one of shape {w.shape}"))
            continue
        g, w = _user_layout(name, g, problem), _user_layout(name, w, problem)
        _, m = compare_array(_PROXY[_kind(name)], g, w, dtype)
        if m is not None:
            if m.message is not None and m.kind == "shape":
                m.message = f"got shape {np.shape(g)}, {against} shape {np.shape(w)}"
            m.quantity = label + _layout_words(name, problem)
            if locate is not None and name in want["params"] and m.message is None:
                m.where = locate(name, m.index)
            mismatches.append(m)
    return mismatches


#: tolerances of the directional derivatives of train mode: (atol, rtol) by dtype
DIFFERENCE_TOLERANCES = {"float64": (1e-8, 1e-5), "float32": (2e-3, 3e-2), "float16": (3e-2, 1e-1)}
_STEPS = {"float64": 1e-5, "float32": 3e-3, "float16": 3e-2}


def _difference_check(module, problem, values, device, got):
    """[Mismatch] between the layer's gradients and central differences of its own loss along
    one random direction per quantity (the generator reseeded before every evaluation)."""
    from .compare import Mismatch

    rng = np.random.default_rng(problem.seed + 7)
    eps, (atol, rtol) = _STEPS[problem.dtype], DIFFERENCE_TOLERANCES[problem.dtype]
    seed = problem.seed % (2**31)
    quantities = [("input", values["x"], got["input"])]
    quantities += [(n, values[k], got[n]) for n, k in (("h_0", "h0"), ("c_0", "c0")) if values[k] is not None]
    quantities += [(n, values["params"][n], got["params"].get(n)) for n in values["params"]]
    mismatches = []
    for name, value, grad in quantities:
        if grad is None:
            mismatches.append(Mismatch(_label(name), (), np.nan, np.nan, 0.0, 0.0, 0.0, "missing",
                                       "none computed in train mode"))
            continue
        direction = rng.standard_normal(value.shape)
        if name == "input" and problem.lengths:
            direction = direction * (np.arange(problem.T)[:, None] < np.asarray(problem.lengths))[..., None]
        ad = float(np.sum(grad * direction))
        scale = float(np.linalg.norm(grad) * np.linalg.norm(direction) / np.sqrt(max(direction.size, 1)))
        # a second, smaller step when the first disagrees: a step across a relu's kink is not
        # a wrong gradient
        for h in (eps, eps / 4):
            plus_loss = _loss_only(module, problem, values, device, seed, {name: direction * h})
            minus_loss = _loss_only(module, problem, values, device, seed, {name: -direction * h})
            fd = (plus_loss - minus_loss) / (2 * h)
            allowed = atol + rtol * max(abs(ad), abs(fd), scale)
            if abs(fd - ad) <= allowed:
                break
        else:
            mismatches.append(Mismatch(_label(name) + " along a random direction (reference: central "
                                       "differences of the layer's loss)", (), ad, fd, allowed,
                                       atol, rtol, "central-difference"))
    return mismatches


# -- one problem ------------------------------------------------------------------------------

def check_problem(factory, problem: Problem, *, device="cpu"):
    """Check one problem; raise :class:`ModuleMismatch` on a difference, :class:`Unsupported`
    when the factory or layer declines it. The factory's layer is a ``torch.nn.Module`` or an
    array layer (:mod:`rnngrad.testing.arrays`)."""
    layer = _make(factory, problem)
    if is_array_layer(layer):
        return _check_array_layer(factory, layer, problem)
    values = problem_values(problem)
    module = _build(factory, problem, device, values, module=layer)
    dtype = np.dtype(problem.dtype)
    seed = problem.seed % (2**31)
    failures = []
    if problem.mode == "eval":
        module.eval()
        failures = compare_runs(_run(module, problem, values, device), reference(problem, values), dtype,
                                problem=problem)
    elif problem.mode == "train":
        if problem.dropout and problem.num_layers > 1:
            # central differences of float32 losses are too coarse for relu's kinks and steep
            # gates: the layer is checked in float64 where the device has it
            if problem.dtype != "float64" and not str(device).startswith("mps"):
                problem = dataclasses.replace(problem, dtype="float64")
                module = _build(factory, problem, device, values)
            module.train()
            got = _run(module, problem, values, device, seed=seed)
            failures = _difference_check(module, problem, values, device, got)
        else:
            module.train()
            got = _run(module, problem, values, device, seed=seed)
            failures = compare_runs(got, reference(problem, values), dtype, problem=problem)
    else:  # train → eval → train on the same shapes
        module.train()
        first = _run(module, problem, values, device, seed=seed)
        module.eval()
        evaluated = _run(module, problem, values, device)
        new = _build(factory, problem, device, values)
        new.eval()
        failures = [_tag(m, "eval after train vs a fresh layer's eval")
                    for m in compare_runs(evaluated, _run(new, problem, values, device), dtype,
                                          against="the fresh layer")]
        failures += [_tag(m, "eval after train")
                     for m in compare_runs(evaluated, reference(problem, values), dtype)]
        module.train()
        again = _run(module, problem, values, device, seed=seed)
        failures += [_tag(m, "train after eval vs the first train run (same seed)")
                     for m in compare_runs(again, first, dtype, against="the first run")]
    if failures:
        raise ModuleMismatch(_message(problem, failures), problem=problem, mismatches=failures)


def _check_array_layer(factory, layer, problem):
    """check_problem for a layer of the array protocol (eval mode only)."""
    from .compare import Mismatch

    if problem.mode != "eval":
        raise Unsupported("train mode: array layers are checked in eval mode")
    names = list(getattr(layer, "parameter_names", ()))
    required = problem.parameter_names("rnngrad")
    allowed = problem.parameter_names("rnngrad", secondary_bias=problem.cell == "gru")
    if not set(required) <= set(names) <= set(allowed):
        raise AssertionError(f"parameter_names: expected {required}"
                             f"{' (and secondary_bias_l·)' if problem.cell == 'gru' else ''}, "
                             f"got {names}")
    values = problem_values(problem, [n for n in allowed if n in names])
    try:
        got = run_layer(layer, problem, values, (_in_layout, _from_layout, _states_layout))
    except NotImplementedError as exc:
        raise Unsupported(f"the layer raised NotImplementedError: {exc}") from exc
    want = reference(problem, values, build=rnngrad_layer(layer.descriptor))
    dtype = np.dtype(problem.dtype)
    framework = getattr(factory, "framework", None) or type(layer).__module__.split(".")[0]
    failures = [Mismatch(n, (), np.nan, np.nan, 0.0, 0.0, 0.0, "dtype",
                         f"got dtype {d}, expected {dtype}")
                for n, d in got.pop("dtypes").items() if d != dtype]
    failures += compare_runs(got, want, dtype, problem=problem,
                             locate=locator(layer, problem, values, framework))
    if failures:
        raise ModuleMismatch(_message(problem, failures), problem=problem, mismatches=failures)


def _tag(m, what):
    m.quantity = f"{m.quantity} ({what})"
    return m


def _message(problem, failures):
    lines = [f"the layer differs on {problem.summary()} ({len(failures)} quantit"
             f"{'y' if len(failures) == 1 else 'ies'}):"]
    lines += [f"  {m}" for m in failures]
    return "\n".join(lines)


def module_reproduction(factory, problem, device="cpu") -> str:
    """A Python script that rebuilds the problem and checks it again (it runs as printed:
    the factory is imported, or a stub says what to put there)."""
    from .check import _callable_source

    role = "a factory with torch.nn.RNN/GRU/LSTM constructor keywords"
    return ("from rnngrad.testing.module import Problem, check_problem\n"
            f"{_callable_source(factory, 'factory', role)}\n"
            f"problem = {problem!r}\n"
            f"check_problem(factory, problem, device={device!r})\n")


@dataclasses.dataclass
class ModuleReport:
    """What :func:`check_module` did: ``checked`` problems compared, ``unsupported``
    {reason: count} of problems the factory or layer declined, ``seconds``."""

    cell: str
    dtype: str
    device: str
    checked: int
    unsupported: dict
    seconds: float

    def __str__(self):
        skipped = sum(self.unsupported.values())
        text = (f"{self.cell} on {self.device} in {self.dtype}: {self.checked} problems passed"
                f"{f', {skipped} unsupported' if skipped else ''} in {self.seconds:.1f}s")
        for reason, count in sorted(self.unsupported.items(), key=lambda kv: -kv[1]):
            text += f"\n  {count} × {reason}"
        return text


def check_module(factory, cell, *, device="cpu", max_examples=150, seed=None, dtype="float32",
                 scenarios_first=True, max_layers=3, max_size=4, boundary=True, threads=1,
                 progress=None, values="contractive", capabilities=None,
                 after_problem=None) -> ModuleReport:
    """Fuzz a framework RNN layer against rnngrad's float64 reference, composed layer by layer.

    factory: ``factory(**config)`` builds a layer from ``torch.nn.RNN`` / ``GRU`` / ``LSTM``'s
        constructor keywords (input_size, hidden_size, num_layers, bias, batch_first, dropout,
        bidirectional, and nonlinearity for ``"rnn"``). Either a ``torch.nn.Module`` with
        ``torch.nn``'s call convention and parameter names (``torch.nn.LSTM`` itself is one; no
        device or dtype: the checker moves it with ``.to(device, dtype)``), or an array layer
        of any framework (:mod:`rnngrad.testing.arrays`: arrays in and out, its own VJP,
        rnngrad's parameter names; no PyTorch needed). It may raise ValueError or
        NotImplementedError for a configuration it does not support, and the layer
        NotImplementedError (or :class:`Unsupported`) for an input form: counted in the
        report, not failed. Its attributes ``capabilities``, ``after_problem`` and ``source``
        stand in for the knobs of those names and for the reproduction's import line.
    cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
    device: where a torch layer runs (``"cpu"``, ``"mps"``, ``"cuda"``).
    max_examples: problems drawn by hypothesis after the fixed scenarios (:func:`scenarios`).
    seed: makes the draws reproducible (None: a fresh random seed).
    dtype: ``"float32"`` or ``"float64"`` (the reference is float64 on the rounded values).
    scenarios_first: check the fixed scenarios first (one problem over 2¹⁶ input elements
        among them).
    max_layers, max_size, boundary: the draws' bounds (sizes 1..max_size, and now and then
        31, 32 or 33 for N, I and H when ``boundary``).
    threads: torch's intra-op threads while the check runs (restored afterwards); None leaves
        torch's setting. The problems are small, where more threads only add synchronisation.
    progress: called with the number of problems checked so far.
    values: ``"contractive"``, ``"saturating"`` (gates at 0 or 1) or ``"nonfinite"`` (one NaN
        or infinity in one batch row's input).
    capabilities: a :class:`Capabilities`: what the layer family can do; nothing else is
        drawn, and the scenarios that need something else are left out.
    after_problem: called after every problem (passed or not): where a JIT framework clears
        its compilation caches.

    Returns a :class:`ModuleReport`; raises :class:`ModuleMismatch` (an AssertionError) naming
    the configuration, the quantity, the index (in the layer's own layout, and for an array
    layer in the framework's own parameters and gate), both values and the tolerance, with a
    runnable reproduction, for the first failing problem, shrunk.
    """
    if cell not in CELLS:
        raise ValueError(f"cell: expected one of {CELLS}, got {cell!r}")
    if np.dtype(dtype).name not in ("float16", "float32", "float64"):
        raise ValueError(f"dtype: expected float16, float32 or float64, got {dtype!r}")
    if values not in VALUES:
        raise ValueError(f"values: expected one of {VALUES}, got {values!r}")
    knobs = dict(device=device, max_examples=max_examples, seed=seed, dtype=np.dtype(dtype).name,
                 scenarios_first=scenarios_first, max_layers=max_layers, max_size=max_size,
                 boundary=boundary, progress=progress, values=values,
                 capabilities=capabilities or getattr(factory, "capabilities", None),
                 after_problem=after_problem or getattr(factory, "after_problem", None))
    try:
        import torch
    except ImportError:  # an array layer needs no torch
        torch = None
    if threads is None or torch is None:
        return _check_module(factory, cell, **knobs)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _check_module(factory, cell, **knobs)
    finally:
        torch.set_num_threads(saved)


def _check_module(factory, cell, *, device, max_examples, seed, dtype, scenarios_first,
                  max_layers, max_size, boundary, progress, values, capabilities, after_problem):
    start = time.perf_counter()
    checked, unsupported = 0, {}

    def one(problem, label=None):
        nonlocal checked
        try:
            check_problem(factory, problem, device=device)
        except Unsupported as exc:
            unsupported[str(exc)] = unsupported.get(str(exc), 0) + 1
            return
        except ModuleMismatch as exc:
            where = f" [scenario {label!r}]" if label else ""
            raise ModuleMismatch(f"{cell}{where}: {exc}\nReproduce with:\n"
                                 f"{module_reproduction(factory, problem, device)}",
                                 problem=problem, mismatches=exc.mismatches) from None
        except Exception as exc:  # a crash on a valid configuration is a failure
            where = f" [scenario {label!r}]" if label else ""
            raise ModuleMismatch(f"{cell}{where}: the layer raised {type(exc).__name__}: {exc}\n"
                                 f"  on {problem.summary()}\nReproduce with:\n"
                                 f"{module_reproduction(factory, problem, device)}",
                                 problem=problem) from exc
        finally:
            if after_problem is not None:
                after_problem()
        checked += 1
        if progress is not None:
            progress(checked)

    count = 0
    if scenarios_first:
        for label, problem in scenarios(cell, dtype, capabilities):
            count += 1
            try:
                one(dataclasses.replace(problem, values=values), label)
            except ModuleMismatch as exc:
                exc.examples = count
                raise
    if max_examples > 0:
        def tick():
            nonlocal count
            count += 1
            return count
        fuzz_draws(problems(cell, dtype=dtype, max_layers=max_layers, max_size=max_size,
                            boundary=boundary, values=values, capabilities=capabilities),
                   one, ModuleMismatch, max_examples=max_examples, seed=seed, tick=tick)
    return ModuleReport(cell, dtype, str(device), checked, unsupported, time.perf_counter() - start)


__all__ = ["check_module", "check_problem", "Problem", "ModuleMismatch", "ModuleReport",
           "Unsupported", "Capabilities", "torch_layer", "VALUES", "problem_values", "reference", "scenarios", "problems",
           "module_reproduction", "compare_runs", "CELLS", "FORMS", "STATES", "LOSSES", "MODES",
           "DIFFERENCE_TOLERANCES"]
