"""opbridge's ops, one module per op: ``<op>.py`` holds everything Python knows of it
(wrapper, fake kernel, autograd, ``nn.Module`` twin, ONNX lowerings, spec, parity
inputs and reference), next to ``cpp/kernels/<op>.h``, ``cpp/torch/<op>.cpp`` and
``cpp/ort/<op>.cc``.

``import opbridge`` imports every module here (those whose names start with an
underscore are helpers) and publishes the names each lists: ``__all__`` as
``opbridge.<name>``, ``NN_MODULES`` as ``opbridge.nn.<name>``. See
docs/adding-an-op.md.
"""
