"""One way to write an ONNX lowering for both of PyTorch's exporters.

A lowering is a Python function ``fn(b, *args)`` that builds nodes through a
builder ``b``:

    def asinh(b, x):
        return b.op("Asinh", x)

``b.op(op_type, *inputs, domain="", **attributes)`` adds a node and returns its
output(s); attributes are plain Python values (int, float, str, lists of them).
For the TorchScript-based exporter ``b`` wraps the symbolic's graph context
(``g.op`` with its ``_i``/``_f``/``_s`` attribute suffixes); for the dynamo
exporter it records onnxscript ops. ``b.opset`` is the opset being exported and
``b.exporter`` is ``"legacy"`` or ``"dynamo"``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: torch dtype -> ONNX element type (onnx.TensorProto.FLOAT, ...), for Cast's ``to`` without importing onnx.
ONNX_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
              torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}  # fmt: skip
#: c10::ScalarType code (a ``dtype`` argument of a TorchScript node) -> torch dtype, for the dtypes ONNX has.
C10_DTYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
              6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}  # fmt: skip
#: TorchScript scalar type / ONNX element type name -> torch dtype, for what builders' dtype() can answer.
_SCALAR_TYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
                 "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8,
                 "Byte": torch.uint8, "Bool": torch.bool}  # fmt: skip
_ELEMENT_TYPES = {"FLOAT": torch.float32, "DOUBLE": torch.float64, "FLOAT16": torch.float16, "BFLOAT16": torch.bfloat16,
                  "INT64": torch.int64, "INT32": torch.int32, "INT16": torch.int16, "INT8": torch.int8,
                  "UINT8": torch.uint8, "BOOL": torch.bool}  # fmt: skip


def _legacy_attribute(name: str, value: Any) -> tuple[str, Any]:
    sample = value[0] if isinstance(value, (list, tuple)) and value else value
    if isinstance(value, torch.Tensor):
        return f"{name}_t", value
    if isinstance(sample, (bool, int)):
        return f"{name}_i", value
    if isinstance(sample, float):
        return f"{name}_f", value
    if isinstance(sample, str):
        return f"{name}_s", value
    raise TypeError(f"attribute {name}={value!r}: expected int, float, str or a list of them")


#: ONNX op -> the first opset where its ``axes`` is an input instead of an attribute.
_AXES_INPUT_SINCE = {"Unsqueeze": 13, "Squeeze": 13, "ReduceSum": 13}


class _Shared:
    """Helpers both builders share: ops whose form changed across opsets, written once."""

    def with_axes(self, op_type: str, value, axes: Sequence[int], **attributes):
        """``op_type`` (Unsqueeze, Squeeze, ReduceMax, ReduceSum, ...) over ``axes``, as an attribute or as an input
        (Unsqueeze/Squeeze/ReduceSum from opset 13, the other Reduce* from 18) as the opset wants."""
        since = _AXES_INPUT_SINCE.get(op_type, 18)
        if self.opset >= since:
            return self.op(op_type, value, self.constant(list(axes)), **attributes)
        return self.op(op_type, value, axes=list(axes), **attributes)

    def unsqueeze(self, value, axes: Sequence[int] | int):
        return self.with_axes("Unsqueeze", value, [axes] if isinstance(axes, int) else axes)

    def cast(self, value, dtype: torch.dtype):
        """``value`` cast to ``dtype``, its type known to the exporter downstream."""
        out = self.op("Cast", value, to=ONNX_TYPES[dtype])
        self.set_type(out, value, self.static_shape(value), dtype)
        return out

    def reduce(self, op_type: str, value, axes: Sequence[int], keepdims: bool = False):
        """``Reduce<op_type>`` (Sum, Max, Min, ...) over ``axes``."""
        return self.with_axes(f"Reduce{op_type}", value, axes, keepdims=int(keepdims))

    def cos_sin(self, angle, like=None):
        """``(cos(angle), sin(angle))``.

        ONNX Runtime has float64 kernels of Cos and Sin only from 1.30. For a float64 angle (opset >= 11) the
        TorchScript-based exporter's graph computes them from Mul/Add/Round instead, to float64 precision on every
        runtime: the angle reduced by multiples of pi/2 (pi/2 split in two parts, as Cody and Waite), Taylor
        polynomials of degree 17 and 18 on [-pi/4, pi/4], the quadrant picked with Where. The dynamo exporter's graph
        optimizer reassociates that arithmetic (errors up to 3e-10): there the ONNX ops, which need ONNX Runtime
        >= 1.30 in float64. ``like``: a value of the same element type whose dtype the exporter knows (e.g. the op's
        input), where ``angle``'s is computed."""
        from ..specs import UnknownToExporter

        try:
            double = (
                self.exporter == "legacy"
                and self.opset >= 11
                and self.dtype(angle if like is None else like, "angle") == torch.float64
            )
        except UnknownToExporter:  # an exporter that does not know the dtype: the ONNX ops
            double = False
        if not double:
            return self.op("Cos", angle), self.op("Sin", angle)

        def c(value: float):
            return self.constant_like(value, angle if like is None else like)

        k = self.op("Round", self.op("Mul", angle, c(2 / math.pi)))
        r = self.op("Sub", self.op("Sub", angle, self.op("Mul", k, c(1.5707963267341256))),
                    self.op("Mul", k, c(6.077100506506192e-11)))  # fmt: skip
        r2 = self.op("Mul", r, r)

        def horner(coefficients):
            out = c(coefficients[-1])
            for value in reversed(coefficients[:-1]):
                out = self.op("Add", self.op("Mul", out, r2), c(value))
            return out

        sin_r = self.op("Mul", r, horner([(-1) ** n / math.factorial(2 * n + 1) for n in range(9)]))
        cos_r = horner([(-1) ** n / math.factorial(2 * n) for n in range(10)])
        quadrant = self.op("Sub", k, self.op("Mul", self.op("Floor", self.op("Mul", k, c(0.25))), c(4.0)))  # 0..3

        def pick(values):  # the value of quadrant 0, 1, 2, 3
            out = values[3]
            for q in (2, 1, 0):
                out = self.op("Where", self.op("Equal", quadrant, c(float(q))), values[q], out)
            return out

        minus_sin, minus_cos = self.op("Neg", sin_r), self.op("Neg", cos_r)
        return pick([cos_r, minus_sin, minus_cos, sin_r]), pick([sin_r, cos_r, minus_sin, minus_cos])


# Ops that keep their first input's sign (indexing, reshaping, casting, rounding), and ops whose result is
# non-negative where all their inputs are.
_FIRST_INPUT_KEEPS_SIGN = frozenset(
    ["Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Identity", "Floor", "Ceil", "Expand", "Flatten"]
)
_ALL_INPUTS_KEEP_SIGN = frozenset(["Concat", "Add", "Mul", "Div", "Max", "Min", "Sqrt"])


class LegacyBuilder(_Shared):
    """Builder over the TorchScript-based exporter's GraphContext."""

    exporter = "legacy"

    def __init__(self, g) -> None:
        from ._schemas import register_schemas

        register_schemas()  # so that onnx.checker knows the custom nodes of the exported model
        self.g = g
        self.opset: int = g.opset

    def op(self, op_type: str, *inputs, domain: str = "", outputs: int = 1, **attributes):
        name = f"{domain}::{op_type}" if domain else op_type
        attrs = dict(_legacy_attribute(k, v) for k, v in attributes.items())
        return self.g.op(name, *inputs, outputs=outputs, **attrs)

    def dtype(self, value, what: str = "input") -> torch.dtype:
        scalar_type = value.type().scalarType() if isinstance(value.type(), torch._C.TensorType) else None
        if scalar_type not in _SCALAR_TYPES:
            from ..specs import UnknownToExporter

            raise UnknownToExporter(
                f"the ONNX export needs the dtype of {what}, but the exporter knows it as {scalar_type!r}; "
                "export with example inputs (not None) of a supported dtype"
            )
        return _SCALAR_TYPES[scalar_type]

    def constant_like(self, value: float, like):
        """A scalar constant with the element type of ``like`` (CastLike where the exporter does not know it)."""
        from ..specs import UnknownToExporter

        try:
            return self.g.op("Constant", value_t=torch.tensor(value, dtype=self.dtype(like)))
        except UnknownToExporter:
            if self.opset < 15:
                raise
            return self.g.op("CastLike", self.g.op("Constant", value_t=torch.tensor(float(value))), like)

    def constant(self, values: Sequence[int] | int):
        """An int64 constant (shapes, axes, indices)."""
        return self.g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

    def tensor(self, value: torch.Tensor):
        """A constant of any dtype and shape."""
        return self.g.op("Constant", value_t=value)

    def value(self, argument, kind: str = "i"):
        """A non-tensor argument (int, float, list) as a Python value."""
        from torch.onnx import symbolic_helper

        return symbolic_helper._maybe_get_const(argument, kind)

    def is_none(self, argument) -> bool:
        from torch.onnx import symbolic_helper

        return argument is None or symbolic_helper._is_none(argument)

    def values(self, argument) -> list:
        """A Tensor[] argument as a list of values."""
        from torch.onnx import symbolic_helper

        return list(symbolic_helper._unpack_list(argument))

    def static_shape(self, value) -> list[int | None] | None:
        """The sizes the exporter knows (None for dynamic dims), or None if not even the rank is known."""
        value_type = value.type()
        return value_type.varyingSizes() if isinstance(value_type, torch._C.TensorType) else None

    def constant_value(self, value) -> torch.Tensor | None:
        """The value of a constant input (a Constant node), or None."""
        node = value.node()
        constant = node.kind() in ("onnx::Constant", "prim::Constant") and node.hasAttribute("value")
        return node.t("value") if constant and node.kindOf("value") == "t" else None

    def dynamic_size(self, value, depth: int = 16) -> bool:
        """Whether ``value`` is a size the exporter does not know: computed from a Shape (or Size) of a value with a
        dynamic dimension by indexing, casting, adding, multiplying or dividing, with non-negative constants, so it
        holds no negative number and will not be folded."""
        return self._size_kind(value, depth) == "dynamic"

    def _size_kind(self, value, depth: int) -> str | None:
        """ "dynamic" or "static" for a non-negative size expression (as dynamic_size), None for anything else."""
        constant = self.constant_value(value)
        if constant is not None:
            return "static" if not constant.numel() or bool((constant >= 0).all()) else None
        if depth == 0:
            return None
        node = value.node()
        kind = node.kind().split("::")[-1]
        inputs = list(node.inputs())
        if kind in ("Shape", "Size") and inputs:
            sizes = self.static_shape(inputs[0])
            return "static" if sizes is not None and None not in sizes else "dynamic"
        operands = inputs[:1] if kind in _FIRST_INPUT_KEEPS_SIGN else inputs if kind in _ALL_INPUTS_KEEP_SIGN else []
        kinds = [self._size_kind(i, depth - 1) for i in operands]
        if not kinds or None in kinds:
            return None
        return "dynamic" if "dynamic" in kinds else "static"
        node = value.node()
        kind = node.kind().split("::")[-1]
        inputs = list(node.inputs())
        if kind in ("Shape", "Size"):
            return True
        if kind in _FIRST_INPUT_KEEPS_SIGN and inputs:
            return self.nonnegative(inputs[0], depth - 1)
        if kind in _ALL_INPUTS_KEEP_SIGN and inputs:
            return all(self.nonnegative(i, depth - 1) for i in inputs)
        return False

    def zeros(self, length: int, like):
        """A 1-D zero tensor of ``length`` elements with the element type of ``like``."""
        return self.g.op("Constant", value_t=torch.zeros(length, dtype=self.dtype(like)))

    def iota(self, length):
        """int64 [0, 1, ..., length - 1] for a scalar int64 ``length`` (Range, or NonZero below opset 11)."""
        if self.opset >= 11:
            return self.g.op("Range", self.constant(0), length, self.constant(1))
        ones = self.g.op("ConstantOfShape", self.g.op("Reshape", length, self.constant([1])), value_t=torch.tensor([1]))
        return self.g.op("Reshape", self.g.op("NonZero", ones), self.constant([-1]))

    def set_broadcast_type(self, out, a, b) -> None:
        """Gives a custom node's output the dtype of ``a`` and the broadcast shape of a and b.

        ONNX shape inference knows nothing of custom domains; without this the
        output would carry no type and downstream shape inference would stop there.
        """
        a_type, b_type = a.type(), b.type()
        if not isinstance(a_type, torch._C.TensorType) or a_type.scalarType() is None:
            return
        b_sizes = b_type.varyingSizes() if isinstance(b_type, torch._C.TensorType) else None
        sizes = _broadcast(a_type.varyingSizes(), b_sizes)
        out.setType(a_type.with_sizes(sizes) if sizes is not None else a_type)

    def set_type(self, out, like, sizes: Sequence[int | None] | None, dtype: torch.dtype | None = None) -> None:
        """Gives a custom node's output the dtype of ``like`` (or ``dtype``) and ``sizes`` (None: unknown dims)."""
        like_type = like.type()
        if isinstance(like_type, torch._C.TensorType) and (like_type.scalarType() is not None or dtype is not None):
            if dtype is not None:
                like_type = like_type.with_dtype(dtype)
            out.setType(like_type.with_sizes(list(sizes)) if sizes is not None else like_type)


class DynamoBuilder(_Shared):
    """Builder recording onnxscript ops, for a custom_translation_table function."""

    exporter = "dynamo"

    def __init__(self, opset: int, target_opset: int | None = None) -> None:
        import onnxscript

        from ._schemas import register_schemas

        register_schemas()  # onnxscript needs the schema of a custom node to emit it
        self.opset = opset
        #: the opset the export asked for, which may be below the one it builds at (18): the graph is converted down
        #: to it, and an op newer than it (Pad-18) keeps the model at 18.
        self.target_opset = opset if target_opset is None else target_opset
        self._onnxscript = onnxscript
        # The exporter builds its graph at opset 18 and converts it to the target
        # opset; ops newer than 18 are recorded at the version that introduced them.
        self._standard = onnxscript.values.Opset("", max(opset, 18))

    def op(self, op_type: str, *inputs, domain: str = "", outputs: int = 1, **attributes):
        from ..specs import CUSTOM_DOMAIN_VERSION

        opset = self._standard if not domain else self._onnxscript.values.Opset(domain, CUSTOM_DOMAIN_VERSION)
        return getattr(opset, op_type)(*inputs, **attributes)

    def unexported(self, op_type: str, like, why: str):
        """A placeholder for an output with no ONNX form (see opbridge.onnx._schemas.UNEXPORTED_DOMAIN): the
        export removes it if the model does not use the output and fails with ``why`` if it does."""
        from ._schemas import UNEXPORTED_DOMAIN, register_unexported_schema

        register_unexported_schema(op_type)
        opset = self._onnxscript.values.Opset(UNEXPORTED_DOMAIN, 1)
        return getattr(opset, op_type)(like, why=why)

    def dtype(self, value, what: str = "input") -> torch.dtype:
        names = _ELEMENT_TYPES
        element = getattr(value, "dtype", None)
        if getattr(element, "name", None) not in names:
            from ..specs import UnknownToExporter

            raise UnknownToExporter(
                f"the ONNX export needs the dtype of {what}, but the exporter knows it as {element!r}"
            )
        return names[element.name]

    def constant_like(self, value: float, like):
        """A scalar of ``like``'s element type: a float64 value keeps its precision where the dtype is known
        (``value_float`` is float32)."""
        from ..specs import UnknownToExporter

        try:
            dtype = self.dtype(like)
        except UnknownToExporter:
            dtype = None
        if dtype == torch.float64:
            return self.tensor(torch.tensor(value, dtype=torch.float64))
        return self._standard.CastLike(self._standard.Constant(value_float=float(value)), like)

    def constant(self, values: Sequence[int] | int):
        if isinstance(values, int):
            return self._standard.Constant(value_int=values)
        if not values:  # an empty attribute list has no type: a tensor says int64
            return self.tensor(torch.zeros(0, dtype=torch.int64))
        return self._standard.Constant(value_ints=list(values))

    def tensor(self, value: torch.Tensor):
        return self._standard.Constant(value=self._onnxscript.ir.tensor(value.numpy()))

    def value(self, argument, kind: str = "i"):
        return argument

    def is_none(self, argument) -> bool:
        return argument is None

    def values(self, argument) -> list:
        return list(argument)

    def static_shape(self, value) -> list[int | None] | None:
        shape = getattr(value, "shape", None)
        if shape is None:
            return None
        return [d if isinstance(d, int) else None for d in shape]

    def zeros(self, length: int, like):
        shape = self._standard.Constant(value_ints=[length])
        return self._standard.CastLike(self._standard.ConstantOfShape(shape), like)

    def iota(self, length):
        return self._standard.Range(self.constant(0), length, self.constant(1))

    def set_broadcast_type(self, out, a, b) -> None:
        """Types come from torch.export's fake tensors; nothing to do."""

    def set_type(self, out, like, sizes, dtype=None) -> None:
        """Types come from torch.export's fake tensors; a node added by a lowering itself (cast) gets its element
        type and shape here, so that the lowering's later steps can read them."""
        if dtype is None or getattr(out, "dtype", None) is not None:
            return
        from onnxscript import ir

        out.dtype = ir.DataType(ONNX_TYPES[dtype])
        if getattr(out, "shape", None) is None and getattr(like, "shape", None) is not None:
            out.shape = like.shape


def _broadcast(a: list | None, b: list | None) -> list | None:
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == 1:
            out.append(y)
        elif y == 1 or y is None or x == y:
            out.append(x)
        else:  # x is unknown and y is a known size other than 1
            out.append(y)
    return out


def dynamo_translation(fn: Callable, opset: int, target_opset: int | None = None) -> Callable:
    """A custom_translation_table entry from a builder lowering (``target_opset``: see DynamoBuilder)."""

    def translation(*args, **kwargs):
        return fn(DynamoBuilder(opset, target_opset), *args, **kwargs)

    # The exporter matches a translation to a node by its parameters (torch <= 2.9 passes over one taking *args
    # for torchlib's own rule of an aten op): show build's, without the builder.
    try:
        signature = inspect.signature(fn)
        translation.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    except (TypeError, ValueError):
        pass
    return translation
