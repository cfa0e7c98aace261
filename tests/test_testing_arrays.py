"""check_module through the array protocol (rnngrad.testing.arrays): torch.nn's GRU and LSTM,
an implementation independent of rnngrad, put behind arrays and rnngrad's parameter names, pass;
a planted fault in the layer is caught, named in the layer's own layout and in the framework's
own parameter and gate; what the capabilities exclude is never drawn; a reproduction runs as
printed; check_backend's knobs for a framework (Unsupported, ill-conditioned problems, forwards
that return only h)."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnngrad as rg  # noqa: E402
from rnngrad.testing import (Capabilities, ModuleMismatch, ReferenceMismatch, Unsupported,  # noqa: E402
                             check_backend, check_module)
from rnngrad.testing.adapters._torch import TorchAutogradLayer  # noqa: E402


def torch_mapping(cell, H, fault=None):
    """torch.nn's parameters of one layer from rnngrad's names (torch operations)."""
    def mapping(params):
        own = {}
        for sfx in ("_l0", "_l0_reverse"):
            if f"input_weight{sfx}" not in params:
                continue
            R = params[f"recurrent_weight{sfx}"]
            if fault == "swapped_gates":  # r and z blocks of the recurrent weight exchanged
                R = torch.cat([R[H:2 * H], R[:H], R[2 * H:]])
            own[f"weight_ih{sfx}"], own[f"weight_hh{sfx}"] = params[f"input_weight{sfx}"], R
            if f"bias{sfx}" in params:
                b = params[f"bias{sfx}"]
                own[f"bias_ih{sfx}"] = b
                hh = torch.zeros_like(b)
                if cell == "gru":
                    hh = torch.cat([hh[:2 * H], params[f"secondary_bias{sfx}"]])
                own[f"bias_hh{sfx}"] = hh
        return own
    return mapping


@dataclasses.dataclass
class TorchArrays:
    """A factory of array layers computed by torch.nn.GRU / LSTM (time-major or batch-first)."""

    cell: str
    fault: str = None
    capabilities: Capabilities = Capabilities(num_layers=1, dropout=False, unbatched=False,
                                              noncontiguous=False)
    asked: list = dataclasses.field(default_factory=list)

    def __call__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, nonlinearity="tanh"):
        self.asked.append(dict(num_layers=num_layers, bidirectional=bidirectional))
        if self.fault == "declines_bidirectional" and bidirectional:
            raise NotImplementedError("bidirectional: not in this layer")
        cls = torch.nn.GRU if self.cell == "gru" else torch.nn.LSTM
        desc = (rg.GRUDescriptor(reset_gate_first=True, reset_after=True) if self.cell == "gru"
                else rg.LSTMDescriptor())
        D, H = 2 if bidirectional else 1, hidden_size
        stems = ["input_weight", "recurrent_weight"] + (["bias"] if bias else [])
        stems += ["secondary_bias"] if bias and self.cell == "gru" else []
        names = [f"{s}{sfx}" for sfx in ("_l0", "_l0_reverse")[:D] for s in stems]
        fault = self.fault

        def build(dtype):
            module = cls(input_size, H, bias=bias, batch_first=batch_first,
                         bidirectional=bidirectional).to(getattr(torch, dtype.name))

            def forward(own, x, h0, c0, lengths):
                hx = None if h0 is None else ((h0, c0) if self.cell == "lstm" else h0)
                inp = x
                if lengths is not None:
                    inp = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=batch_first,
                                                                  enforce_sorted=False)
                out, hn = torch.func.functional_call(module, own, (inp, hx))
                if lengths is not None:
                    out = torch.nn.utils.rnn.pad_packed_sequence(
                        out, batch_first=batch_first, total_length=x.shape[1 if batch_first else 0])[0]
                if fault == "one_row_off":  # batch row 1's output off by 1e-2
                    out = out + 1e-2 * (torch.arange(out.shape[0 if batch_first else 1]) == 1).reshape(
                        (-1, 1, 1) if batch_first else (1, -1, 1))
                hn, cn = hn if self.cell == "lstm" else (hn, None)
                return out, hn, cn
            return forward

        return TorchAutogradLayer(desc, names, torch_mapping(self.cell, H, fault), build)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_torch_nn_through_the_array_protocol_passes(cell):
    report = check_module(TorchArrays(cell), cell, max_examples=25, seed=2)
    assert report.checked >= 25 and not report.unsupported


def test_float64_passes_too():
    assert check_module(TorchArrays("gru"), "gru", max_examples=10, seed=3, dtype="float64").checked


def test_a_planted_gate_swap_names_the_frameworks_parameter_and_gate():
    with pytest.raises(ModuleMismatch) as info:
        check_module(TorchArrays("gru", fault="swapped_gates"), "gru", max_examples=10, seed=1)
    message = str(info.value)
    assert "`recurrent_weight_l0" in message and "weight_hh_l0" in message and "gate " in message


def test_a_batch_first_mismatch_is_indexed_in_the_layers_layout():
    with pytest.raises(ModuleMismatch) as info:
        check_module(TorchArrays("lstm", fault="one_row_off"), "lstm", max_examples=0)
    problem = info.value.problem
    m = next(m for m in info.value.mismatches if m.quantity.startswith("output"))
    assert problem.batch_first and "[N,T,D·H]" in m.quantity and m.index[0] == 1


def test_capabilities_keep_draws_and_scenarios_within_them():
    factory = TorchArrays("gru", capabilities=Capabilities(num_layers=1, bidirectional=False,
                                                          dropout=False, unbatched=False,
                                                          noncontiguous=False))
    check_module(factory, "gru", max_examples=20, seed=4)
    assert factory.asked and all(a == dict(num_layers=1, bidirectional=False) for a in factory.asked)


def test_declined_configurations_are_counted_not_failed():
    report = check_module(TorchArrays("gru", fault="declines_bidirectional"), "gru",
                          max_examples=15, seed=5)
    assert sum(report.unsupported.values()) > 0 and report.checked > 0


def test_an_adapter_reproduction_runs_as_printed():
    with pytest.raises(ModuleMismatch) as info:
        check_module(_faulty_gru(), "gru", max_examples=0)
    script = str(info.value).split("Reproduce with:\n", 1)[1]
    assert f"from {__name__} import _faulty_gru" in script
    with pytest.raises(ModuleMismatch):
        exec(script, {})


def _faulty_gru():
    factory = TorchArrays("gru", fault="swapped_gates")
    factory.source = (f"from {__name__} import _faulty_gru", "_faulty_gru()")
    return factory


def test_nonfinite_values_reach_the_layer_and_torch_agrees_on_tanh_layers():
    report = check_module(TorchArrays("lstm"), "lstm", max_examples=10, seed=6, values="nonfinite")
    assert report.checked > 0


# -- check_backend's knobs ------------------------------------------------------------------

def _forward_h_only(**kwargs):
    """The reference's forward returning only h: an implementation that keeps no z_state."""
    return [rg.single_gate_rnn(**kwargs, backend="reference").state]


def test_a_forward_that_returns_only_h_passes_with_z_state_off():
    assert check_backend(_forward_h_only, "single_gate_rnn", max_examples=10, seed=1) > 10


def test_unsupported_problems_are_skipped():
    def no_bidirectional(**kwargs):
        if kwargs["descriptor"].bidirectional:
            raise Unsupported("bidirectional")
        return _forward_h_only(**kwargs)

    assert check_backend(no_bidirectional, "single_gate_rnn", max_examples=10, seed=1) > 0


def test_forward_regressions_are_named_for_a_forward():
    import rnngrad.testing.strategies as rs

    names = [name for name, _ in rs.regression_cases("single_gate_rnn")]
    assert "batch_first" in names and not any(n.endswith("_backward") for n in names)
    assert "final_state_only" not in names
    assert "batch_first_backward" in [n for n, _ in rs.regression_cases("single_gate_rnn_gradients")]


def test_empty_false_and_final_cells_draw_neither_empty_problems_nor_per_step_cells():
    def lstm_grads(**kwargs):
        cg = kwargs.get("cell_gradient")
        assert kwargs["source"].shape[0] > 0 and kwargs["source"].shape[1] > 0
        assert cg is None or cg.ndim == 2 or cg.shape[0] in (1,) or cg.shape[0] != kwargs["source"].shape[0]
        return rg.lstm_gradients(**kwargs, backend="reference")

    assert check_backend(lstm_grads, "lstm_gradients", z_state=True, max_examples=25, seed=2,
                         empty=False, cell_gradient_form="final") > 0


def test_an_ill_conditioned_problem_is_told_from_a_tame_one():
    from rnngrad.testing import random_case
    from rnngrad.testing.check import is_ill_conditioned
    from rnngrad.testing.strategies import _saturate, regression_case

    desc = rg.GRUDescriptor(output_gate_activation="tanh", update_gate_activation="tanh")
    case = _saturate(random_case(0, "gru", T=4, N=2, I=3, H=3, scale=1.0, descriptor=desc,
                                 optional=dict(input_weight=True, bias=True, mask=False)))
    case = dataclasses.replace(case, source_gradient=case.source_gradient * 1e6).astype(np.float32)
    assert is_ill_conditioned(case, "gru_gradients")
    assert not is_ill_conditioned(regression_case("batch_first_backward", "gru"), "gru_gradients")


def test_a_mismatch_on_tame_problems_is_still_reported():
    def off(**kwargs):
        out = rg.gru(**kwargs, backend="reference")
        return [out.state * np.float32(1.01)] + list(out)[1:]

    with pytest.raises(ReferenceMismatch):
        check_backend(off, "gru", max_examples=0, z_state=True)


@pytest.mark.parametrize("cell,op", [("gru", "gru"), ("lstm", "lstm")])
def test_an_array_layer_serves_as_the_ops_for_check_backend(cell, op):
    from rnngrad.testing.layer_ops import layer_ops, layer_knobs

    forward, gradients = layer_ops(TorchArrays(cell), cell)
    assert check_backend(forward, op, max_examples=20, seed=7,
                         **layer_knobs(TorchArrays(cell), cell, forward=True)) > 15
    assert check_backend(gradients, op + "_gradients", forward=forward, max_examples=20, seed=7,
                         **layer_knobs(TorchArrays(cell), cell)) > 15


def test_an_array_layers_ops_catch_its_fault():
    from rnngrad.testing.layer_ops import layer_ops, layer_knobs

    forward, gradients = layer_ops(TorchArrays("gru", fault="swapped_gates"), "gru")
    with pytest.raises(ReferenceMismatch):
        check_backend(gradients, "gru_gradients", forward=forward, max_examples=10, seed=7,
                      **layer_knobs(TorchArrays("gru"), "gru"))


def scaled_gru(scale, **kwargs):
    """The reference's GRU forward with its h scaled: a fault for a partial to carry."""
    out = rg.gru(**kwargs, backend="reference")
    return [out.state * np.asarray(scale, out.state.dtype)] + list(out)[1:]


def test_a_partial_of_an_importable_function_reproduces_as_printed():
    import functools

    with pytest.raises(ReferenceMismatch) as info:
        check_backend(functools.partial(scaled_gru, 1.01), "gru", max_examples=0, z_state=True)
    script = str(info.value).split("Reproduce with:\n", 1)[1]
    assert "functools.partial(_function, 1.01)" in script and "NotImplementedError" not in script
    with pytest.raises(ReferenceMismatch):
        exec(script, {})
