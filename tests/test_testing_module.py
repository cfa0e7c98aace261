"""rnngrad.testing.check_module: whole framework layers against the reference composed layer by
layer. torch.nn's layers pass; every planted layer fault is caught, with the configuration, the
quantity, both values, the tolerance and a reproduction that runs as printed; unsupported
configurations are counted; MLX's layers through the adapter."""

import dataclasses
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rnngrad.testing import ModuleMismatch, check_module  # noqa: E402
from rnngrad.testing.module import Problem, check_problem, scenarios  # noqa: E402
from rnngrad.testing.mutants import LAYER_FAULT_LIST, LAYER_FAULTS, layer_factory  # noqa: E402

LAYERS = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}


def sliced_states_lstm(**config):
    """An importable factory with a planted fault: layer k reads h_0[k:k+D]."""
    return layer_factory("lstm", "initial_state_slices")(**config)


@pytest.mark.parametrize("cell", sorted(LAYERS))
def test_torch_nn_layers_pass(cell):
    report = check_module(LAYERS[cell], cell, max_examples=4, seed=1)
    assert report.checked == len(scenarios(cell)) + 4 and not report.unsupported


def test_the_composed_layer_without_a_fault_passes_the_scenarios():
    for cell in ("gru", "lstm"):
        assert check_module(layer_factory(cell), cell, max_examples=0).checked == len(scenarios(cell))


@pytest.mark.parametrize("name", sorted(LAYER_FAULTS))
def test_every_layer_fault_is_caught_by_the_scenarios(name):
    with pytest.raises(ModuleMismatch) as info:
        check_module(LAYER_FAULTS[name].factory("lstm"), "lstm", max_examples=0)
    assert info.value.mismatches or "raised" in str(info.value)
    assert "Reproduce with:" in str(info.value)


def test_a_failure_names_configuration_quantity_values_tolerance_and_reproduces():
    with pytest.raises(ModuleMismatch) as info:
        check_module(layer_factory("lstm", "no_bias_gradient"), "lstm", max_examples=0)
    message = str(info.value)
    assert "num_layers=" in message and "batch_first=" in message and "float32" in message
    assert "`bias_ih_l" in message and "gradient: none computed" in message
    with pytest.raises(ModuleMismatch) as info:
        check_module(sliced_states_lstm, "lstm", max_examples=0)
    exc, message = info.value, str(info.value)
    m = exc.mismatches[0]
    assert repr(m.got) in message and repr(m.want) in message and f"atol={m.atol:g}" in message
    assert exc.problem.bidirectional and exc.problem.num_layers > 1 and exc.problem.states == "random"
    script = message.split("Reproduce with:\n", 1)[1]
    assert f"from {__name__} import sliced_states_lstm as factory" in script
    with pytest.raises(ModuleMismatch):
        exec(script, {})


def test_draws_alone_find_a_fault_and_shrink_it():
    with pytest.raises(ModuleMismatch) as info:
        check_module(layer_factory("gru", "bidirectional_biases_mixed"), "gru", scenarios_first=False,
                     max_examples=40, seed=0)
    p = info.value.problem
    assert p.bidirectional and p.bias and p.num_layers == 1 and p.T == 1 and p.H == 1


def test_a_shape_mismatch_and_a_crash_are_failures():
    def crashes(**config):
        layer = torch.nn.GRU(**config)
        layer.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("graph compile failed"))
        return layer

    with pytest.raises(ModuleMismatch, match="raised RuntimeError: graph compile failed"):
        check_module(crashes, "gru", max_examples=0)


def test_unsupported_configurations_are_counted_not_failed():
    def unidirectional(**config):
        if config["bidirectional"]:
            raise NotImplementedError("bidirectional")
        return torch.nn.LSTM(**config)

    report = check_module(unidirectional, "lstm", max_examples=6, seed=2)
    assert report.checked > 0 and sum(report.unsupported.values()) > 0
    assert any("bidirectional" in reason for reason in report.unsupported)
    assert "unsupported" in str(report)


def test_a_wrong_nonlinearity_is_caught():
    """The rnn cell's drawn nonlinearity reaches the factory (a layer ignoring it fails)."""
    def always_tanh(**config):
        return torch.nn.RNN(**dict(config, nonlinearity="tanh"))

    problem = Problem("rnn", nonlinearity="relu", T=3, N=2, I=2, H=3, seed=3)
    with pytest.raises(ModuleMismatch, match="output"):
        check_problem(always_tanh, problem)
    check_problem(torch.nn.RNN, problem)


def test_dropout_in_train_mode_is_checked_against_central_differences():
    problem = dict(scenarios("gru"))["dropout_gradients"]
    check_problem(torch.nn.GRU, problem)
    with pytest.raises(ModuleMismatch, match="central differences"):
        check_problem(layer_factory("gru", "dropout_mask_ignored_in_backward"), problem)
    with pytest.raises(ModuleMismatch, match="fresh layer"):
        check_problem(layer_factory("gru", "eval_reuses_train_dropout"),
                      dataclasses.replace(problem, mode="sequence"))


def test_the_testing_package_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import rnngrad.testing; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=".")
    assert out.stdout.strip() == "ok", out.stderr


def test_the_mps_command_says_it_needs_a_mac():
    from verification.check_module_mps import main, mps_unavailable

    if mps_unavailable() is None:
        pytest.skip("this machine has an MPS device")
    assert main([]) == 2


def test_mlx_layers_through_the_adapter():
    pytest.importorskip("mlx.core")
    from rnngrad.testing.mlx_adapter import mlx_factory

    report = check_module(mlx_factory("lstm"), "lstm", max_examples=4, seed=4)
    assert report.checked > 0 and not report.unsupported  # its capabilities: nothing it lacks
    from rnngrad.testing import Capabilities

    everything = check_module(mlx_factory("lstm"), "lstm", max_examples=4, seed=4,
                              capabilities=Capabilities())
    assert any("bidirectional" in reason for reason in everything.unsupported)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cell", sorted(LAYERS))
def test_torch_nn_layers_pass_with_default_settings(cell, dtype):
    report = check_module(LAYERS[cell], cell, dtype=dtype)
    assert report.checked > len(scenarios(cell)) and report.seconds < 120


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("name", sorted(LAYER_FAULTS))
def test_every_layer_fault_is_caught_with_default_settings_on_every_cell(name, cell):
    with pytest.raises(ModuleMismatch):
        check_module(LAYER_FAULTS[name].factory(cell), cell)


def test_there_is_a_layer_fault_for_each_class():
    assert len({f.bug_class for f in LAYER_FAULT_LIST}) == len(LAYER_FAULT_LIST) >= 9
