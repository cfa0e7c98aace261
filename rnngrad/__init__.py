"""rnngrad: forward passes and BPTT gradients of MPSGraph's recurrent ops, exactly."""

__version__ = "0.1.0"
