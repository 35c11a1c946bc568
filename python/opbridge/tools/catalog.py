"""The table of what opbridge ships, derived from the registered op modules and mappings:
``python -m opbridge ops`` prints it, ``--markdown docs/ops.md`` writes the docs' copy, ``--check`` fails
when that copy is stale (the test suite runs it, so a new op cannot be missing from the docs)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .. import _slices, specs

_TYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
}


def _opsets(lowering: specs.Lowering) -> str:
    high = "newest" if lowering.max_opset is None else str(lowering.max_opset)
    return f"opset {lowering.min_opset}–{high}"


def _lowerings(spec: specs.OpSpec) -> str:
    return "; ".join(
        f"{lw.kind}: {lw.note + ' ' if lw.note else ''}({_opsets(lw)})" for lw in spec.lowerings
    )  # fmt: skip


def _python_names(spec: specs.OpSpec) -> str:
    if spec.namespace != "opbridge":
        return f"torch's own (`{spec.torch_op}`)"
    from .. import _C

    name = spec.torch_op.split("::")[1]
    module = {m.__name__.rsplit(".", 1)[1]: m for m in _slices.op_modules()}.get(name)
    names = [f"`opbridge.{n}`" for n in getattr(module, "__all__", ())]
    names += [f"`opbridge.nn.{n}`" for n in getattr(module, "NN_MODULES", ())]
    names += [f"`torch.ops.{spec.torch_op.replace('::', '.')}`"]
    if hasattr(_C, name):
        names.append(f"`opbridge._C.{name}` (pybind11)")
    return ", ".join(names)


def _ort(spec: specs.OpSpec) -> str:
    node = spec.custom_node
    custom = [lw.note for lw in spec.lowerings if lw.kind == "custom"]
    if node is not None:
        types = ", ".join(_TYPES.get(t, t) for t in node.types)
        return f"`opbridge::{node.op_type}` ({types}); standard lowerings: ONNX Runtime's own kernels"
    if custom:
        return f"custom: {', '.join(custom)}; standard lowerings: ONNX Runtime's own kernels"
    return "ONNX Runtime's own kernels"


def markdown() -> str:
    lines = [
        "# Ops and mappings",
        "",
        "Generated from the op modules (`python/opbridge/ops/`) and mappings (`python/opbridge/mappings/`) by",
        "`python -m opbridge ops --markdown docs/ops.md`; do not edit by hand (the tests fail when it is stale).",
        "Every lowering serves both of torch's exporters; `standard` is the default, `custom` runs in ONNX",
        "Runtime with opbridge's library, `function` carries its ONNX function in the model.",
        "",
        "| op | Python | dtypes (parity) | ONNX lowerings | ORT kernel |",
        "|---|---|---|---|---|",
    ]
    for spec in sorted(specs.builtin_specs(), key=lambda s: (s.namespace != "opbridge", s.name)):
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        lines.append(
            f"| `{spec.name}`: {spec.doc} | {_python_names(spec)} | {dtypes} | {_lowerings(spec)} | {_ort(spec)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from .._cli import ops_parser

    args = ops_parser().parse_args(argv)
    import opbridge

    opbridge._load()  # the op modules and mappings register on import

    text = markdown()
    if args.check:
        if not args.check.is_file() or args.check.read_text() != text:
            print(f"{args.check} is stale: run python -m opbridge ops --markdown {args.check}", file=sys.stderr)
            return 1
        return 0
    if args.markdown:
        args.markdown.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
