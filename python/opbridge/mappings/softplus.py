"""aten::softplus for the TorchScript-based exporter, with ``beta`` and ``threshold`` honoured.

torch's own rule (torch 2.14.1) writes ``Softplus(beta * x) / beta`` and drops ``threshold``, above which torch
returns ``x`` itself (the coverage sweep: max error 0.011 with ``beta=2, threshold=1``; with the defaults, 20,
the two agree to float32 rounding). This rule adds the threshold; the dynamo exporter is right already.
"""

from __future__ import annotations

import torch

from .. import specs


def _softplus(b, self, beta, threshold):
    beta_value, threshold_value = float(b.value(beta, "f")), float(b.value(threshold, "f"))
    scaled = self if beta_value == 1.0 else b.op("Mul", self, b.constant_like(beta_value, self))
    smooth = b.op("Softplus", scaled)
    if beta_value != 1.0:
        smooth = b.op("Div", smooth, b.constant_like(beta_value, self))
    return b.op("Where", b.op("Greater", scaled, b.constant_like(threshold_value, self)), self, smooth)


class _Softplus(torch.nn.Module):
    def __init__(self, beta: float, threshold: float) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return torch.nn.functional.softplus(x, self.beta, self.threshold)


_PATHS = {"default": (1.0, 20.0), "beta2_threshold1": (2.0, 1.0), "beta_half_threshold3": (0.5, 3.0)}


def _reference(x, path: str = "default"):
    beta, threshold = _PATHS[path]
    data = x.double()
    return torch.where(data * beta > threshold, data, torch.log(1 + torch.exp(data * beta)) / beta).to(x.dtype)


specs.register(
    specs.OpSpec(
        name="softplus",
        torch_op="aten::softplus",
        doc="aten::softplus -> Softplus with beta and threshold (torch's TorchScript-exporter rule drops threshold)",
        lowerings=[specs.Lowering("standard", specs.half_storage(_softplus), min_opset=9, note="Softplus, Where")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={name: (lambda a=a: _Softplus(*a)) for name, a in _PATHS.items()},
        sample_inputs=lambda dtype, operands, batch: (
            torch.randn(batch, 3, 8, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)
            .mul(4)
            .to(dtype),
        ),
        input_names=("x",),
        reference=_reference,
        known_gaps=lambda cell: (
            "ONNX Runtime implements Softplus for float32 only" if cell.dtype == "float64" else None
        ),
    )
)
