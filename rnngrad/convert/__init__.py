"""Converters between rnngrad's arguments and PyTorch's or ONNX's recurrent layers.

``rnngrad.convert.torch`` maps a single-layer ``torch.nn.RNN`` / ``GRU`` / ``LSTM`` (or its
state dict) to rnngrad's arguments and descriptor, and rnngrad's results and gradients back to
PyTorch's outputs and parameter gradients. ``rnngrad.convert.onnx`` does the same for the ONNX
``RNN`` / ``GRU`` / ``LSTM`` operators. Neither imports torch or onnx when rnngrad is imported:
the PyTorch converter only reads tensors (``.detach().cpu().numpy()``), and the ONNX converter
imports onnx only to read a ``NodeProto``.

    from rnngrad.convert import torch as rgt
    layer = rgt.from_module(torch.nn.GRU(8, 16, bidirectional=True, batch_first=True))
    output, h_n = layer.forward(x, h0)
    grads = layer.gradients(x, h0, grad_output=gy)      # grads.parameters["weight_hh_l0"], …
"""

__all__ = ["torch", "onnx"]
