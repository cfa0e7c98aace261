"""torch.compile: an autograd.Function whose forward takes ``*args`` (with ``setup_context``)
does not trace when no input needs a gradient (grad mode off, or inputs that do not require
grad).

Dynamo then inlines the Function's forward and decides whether to pass it the context by
comparing the forward's parameter count with the call's arguments; a ``*args`` forward has one
parameter, so it is given the context as its first argument, and the trace fails with
``InternalTorchDynamoError: AttributeError: 'AutogradFunctionContextVariable' object has no
attribute 'proxy'``. An input that needs a gradient, or the forward's parameters spelled out,
and it compiles. (rnngrad's operators' Functions take ``*args``: ``rnngrad.torch`` calls the
operator itself when nothing needs a gradient.)

    python verification/repro/torch_compile_function_varargs_forward.py
"""
import torch


def function(forward):
    return type("F", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(lambda ctx, inputs, output: None),
        "backward": staticmethod(lambda ctx, g: (2.0 * g, None))})


print("torch", torch.__version__)
for name, fn in (("*args", function(lambda *args: args[0] * args[1])),
                 ("x, k", function(lambda x, k: x * k))):
    for grad_mode, needs in ((True, True), (True, False), (False, True)):
        torch._dynamo.reset()
        x = torch.randn(3, requires_grad=needs)
        compiled = torch.compile(lambda x: fn.apply(x, 2.0), fullgraph=True, backend="eager")
        case = f"forward({name}), grad mode {'on' if grad_mode else 'off'}, " \
               f"input {'needs' if needs else 'without'} grad"
        try:
            with torch.set_grad_enabled(grad_mode):
                equal = torch.equal(compiled(x), x * 2.0)
            print(f"{case:55s} compiles, {'equal' if equal else 'DIFFERENT'} to eager")
        except Exception as e:  # noqa: BLE001 (what the compiler raises is the finding)
            print(f"{case:55s} {type(e).__name__}: {str(e).splitlines()[0][:90]}")
