"""aten::scaled_dot_product_attention at opsets 11-13 for the TorchScript-based exporter, whose rule needs opset 14
("Support for this operator was added in version 14").

Every transformers model with attention calls ``F.scaled_dot_product_attention`` (its default "sdpa" attention):
Deformable DETR, RT-DETR, Grounding DINO, Mask2Former, ViT, Swin, ... all failed at opset 11 on it. The rule is the
definition, ``softmax(q @ k^T * scale + mask) @ v``: the scale is 1/sqrt(E) read at run time unless given, a boolean
mask becomes 0 / -inf, ``is_causal`` a lower-triangular one (Range, opset 11). A non-zero ``dropout_p`` (random in
eager) and ``enable_gqa`` are refused with a LoweringError rather than exported as something else. From opset 14 on,
torch's own rule runs.
"""

from __future__ import annotations

import math

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES


def _flag(b, argument, kind: str, default):
    return default if argument is None or b.is_none(argument) else b.value(argument, kind)


def _positions(b, length):
    """int64 [0, ..., length - 1] from a 0-d length: CumSum of ones (the TorchScript exporter's shape inference of
    Range crashes on some graphs of torch 2.14: a segfault while the node is created)."""
    ones = b.op("ConstantOfShape", b.op("Reshape", length, b.constant([1])), value=torch.tensor([1]))
    return b.op("Sub", b.op("CumSum", ones, b.constant(0)), b.constant(1))


def _sdpa(b, query, key, value, attn_mask=None, dropout_p=None, is_causal=None, scale=None, enable_gqa=None):
    if float(_flag(b, dropout_p, "f", 0.0)) != 0.0:
        raise specs.LoweringError(
            "scaled_dot_product_attention export: dropout_p is not 0, and its dropout is random in eager; export "
            "the model in eval mode (transformers passes dropout 0.0 then)"
        )
    if bool(_flag(b, enable_gqa, "b", False)):
        raise specs.LoweringError(
            "scaled_dot_product_attention export: enable_gqa=True is not supported below opset 14"
        )
    dtype = b.dtype(query, "query")
    rank = len(b.static_shape(key) or [])
    if rank < 2:
        raise specs.UnknownToExporter("scaled_dot_product_attention export: the rank of key is unknown")
    perm = [*range(rank - 2), rank - 1, rank - 2]
    scores = b.op("MatMul", query, b.op("Transpose", key, perm=perm))
    given = _flag(b, scale, "f", None)
    if given is not None:
        factor = b.op("Constant", value=torch.tensor(float(given), dtype=dtype))
    else:  # 1 / sqrt(E), E = query.shape[-1] at run time
        embed = b.op("Gather", b.op("Shape", query), b.constant(-1), axis=0)
        factor = b.op("Reciprocal", b.op("Sqrt", b.op("Cast", embed, to=ONNX_TYPES[dtype])))
    scores = b.op("Mul", scores, factor)
    minus_inf = b.op("Constant", value=torch.tensor(-math.inf, dtype=dtype))
    zero = b.op("Constant", value=torch.tensor(0.0, dtype=dtype))
    if bool(_flag(b, is_causal, "b", False)):
        rows = b.op("Gather", b.op("Shape", query), b.constant(-2), axis=0)
        cols = b.op("Gather", b.op("Shape", key), b.constant(-2), axis=0)
        i = b.op("Reshape", _positions(b, rows), b.constant([-1, 1]))
        j = _positions(b, cols)  # broadcasts as [1, S]
        scores = b.op("Add", scores, b.op("Where", b.op("Greater", j, i), minus_inf, zero))
    if attn_mask is not None and not b.is_none(attn_mask):
        if b.dtype(attn_mask, "attn_mask") == torch.bool:
            attn_mask = b.op("Where", attn_mask, zero, minus_inf)
        elif b.dtype(attn_mask, "attn_mask") != dtype:
            attn_mask = b.op("Cast", attn_mask, to=ONNX_TYPES[dtype])
        scores = b.op("Add", scores, attn_mask)
    return b.op("MatMul", b.op("Softmax", scores, axis=-1), value)


class _Attention(torch.nn.Module):
    def __init__(self, mask: str = "none", is_causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.mask, self.is_causal, self.scale = mask, is_causal, scale

    def forward(self, q, k, v):
        mask = None
        if self.mask == "bool":
            mask = (k[..., :1].transpose(-1, -2) > -1.0).expand(*q.shape[:-1], k.shape[-2])  # [.., Lq, S]
        elif self.mask == "float":  # per key, broadcast over queries; no node ORT lacks a bfloat16 kernel of
            mask = k[..., :1].transpose(-1, -2)  # [.., 1, S]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.is_causal,
                                                                scale=self.scale)  # fmt: skip


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    q = torch.randn(batch, 2, 5, 8, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, 2, 6, 8, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, 2, 6, 3, generator=generator, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _reference(q, k, v, path: str = "plain"):
    q, k, v = q.double(), k.double(), v.double()
    scale = 0.3 if path == "scale" else 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2) * scale
    if path == "bool_mask":
        scores = scores.masked_fill(~(k[..., :1].transpose(-1, -2) > -1.0), -math.inf)
    if path == "float_mask":
        scores = scores + k[..., :1].transpose(-1, -2)
    if path == "causal":
        rows, cols = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(rows, cols, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, -1) @ v


specs.register(
    specs.OpSpec(
        name="scaled_dot_product_attention",
        torch_op="aten::scaled_dot_product_attention",
        doc="aten::scaled_dot_product_attention at opsets 11-13 -> MatMul, Softmax, MatMul (torch's TorchScript "
        "rule needs opset 14)",
        lowerings=[
            specs.Lowering(
                "standard", specs.half_storage(_sdpa), min_opset=11, max_opset=13, note="MatMul, Softmax, MatMul"
            )
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={
            "plain": _Attention,
            "scale": lambda: _Attention(scale=0.3),
            "bool_mask": lambda: _Attention("bool"),
            "float_mask": lambda: _Attention("float"),
            "causal": lambda: _Attention(is_causal=True),
        },
        sample_inputs=_sample_inputs,
        input_names=("q", "k", "v"),
        reference=_reference,
    )
)
