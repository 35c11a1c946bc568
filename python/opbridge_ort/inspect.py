"""``python -m opbridge_ort inspect MODEL.onnx`` (also ``python -m opbridge inspect``).

Lists a model's opsets and nodes by domain and says, for each op, whether the
installed ONNX Runtime can run it without and with the opbridge library, and
what to do when it cannot: the answer to "X is not a registered function/op".
Torch-free.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from dataclasses import dataclass, field

from . import DOMAIN, NO_KERNEL_FOR_TYPES, TYPE_REFUSALS, cuda_library_path, foreign_ops, openmmlab, ops

STANDARD_DOMAINS = ("", "ai.onnx")
# The element types of the CUDA library's nodes (cpp/ort/cuda/*.cc): no bfloat16 node there.
CUDA_ELEMENT_TYPES = ("float", "double", "float16")
# A node's floating inputs: the types a library node may declare.
_FLOATING = {1: "float", 11: "double", 10: "float16", 16: "bfloat16"}
FUNCTION_DOMAIN = "opbridge.functions"


@dataclass
class OpReport:
    domain: str
    op_type: str
    count: int
    opset: int | None
    without_library: bool
    with_library: bool
    how: str
    advice: str = ""
    cuda: str = "?"  # on ORT's CUDA execution provider: "yes", "no" (runs on the CPU provider) or "?" (unknown here)
    library: bool = False  # a node of the opbridge library (opbridge's domain, or another project's it runs)
    element_types: set[str] = field(default_factory=set)  # of the library's nodes' floating inputs, where known


def _kernels(provider: str = "CPUExecutionProvider") -> dict[tuple[str, str], list[tuple[int, int]]]:
    from onnxruntime.capi import _pybind_state

    table: dict[tuple[str, str], list[tuple[int, int]]] = collections.defaultdict(list)
    for kernel in _pybind_state.get_all_opkernel_def():
        if kernel.provider == provider:
            domain = "" if kernel.domain in STANDARD_DOMAINS else kernel.domain
            table[(domain, kernel.op_name)].append(tuple(kernel.version_range))
    return table


def _cuda_nodes() -> set[tuple[str, str]] | None:
    """The (domain, op type) of the library's CUDA nodes, or None where this installation has no CUDA library."""
    path = cuda_library_path()
    if path is None:
        return None
    return {(DOMAIN, op) for op in ops(path)} | set(foreign_ops(path))


def _cuda_column(report: OpReport, cuda_nodes, ort_cuda_kernels) -> str:
    """Whether a node runs on ORT's CUDA execution provider: the library's CUDA nodes by their marker, standard ops
    by the runtime's own CUDA kernels (known only to an onnxruntime built with that provider)."""
    key = (report.domain, report.op_type)
    if _run_by_library(report) or openmmlab.find(*key) is not None:
        if not report.with_library:
            return "-"
        if cuda_nodes is None:
            return "no"  # no CUDA library in this installation: the CPU provider runs it
        if report.element_types - set(CUDA_ELEMENT_TYPES):
            return "no"  # e.g. MyAdd in bfloat16: a CPU kernel only
        return "yes" if key in cuda_nodes else "no"
    if report.how.startswith(("turned into an initializer", "model-local ONNX function", "expanded from")):
        return "yes"  # no kernel of its own
    if ort_cuda_kernels is None:
        return "?"
    ranges = ort_cuda_kernels.get(key, [])
    return "yes" if report.opset is not None and any(low <= report.opset <= high for low, high in ranges) else "no"


def _run_by_library(report: OpReport) -> bool:
    return report.domain == DOMAIN or report.library


def _graphs(graph):
    """``graph`` and its subgraphs (If, Loop, Scan bodies), nested ones too."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs]:
                if subgraph.node:
                    yield from _graphs(subgraph)


def _element_types(model) -> dict[str, int]:
    """The element type of each value of ``model``'s graphs (the main graph's and its subgraphs': a name is defined
    once in a model, and a subgraph reads its outer graphs' values by name) that declares or infers one."""
    import onnx

    with contextlib.suppress(Exception):  # e.g. past protobuf's 2 GB: what the model declares
        model = onnx.shape_inference.infer_shapes(model)
    types: dict[str, int] = {}
    for graph in _graphs(model.graph):
        types.update((t.name, t.data_type) for t in graph.initializer)
        for value in [*graph.input, *graph.value_info, *graph.output]:
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types[value.name] = value.type.tensor_type.elem_type
    return types


def _check_element_types(model, reports: list[OpReport]) -> None:
    """Whether the library has a kernel for the element types of each of its nodes in ``model`` (subgraphs too; where
    the types are known): each distinct (node, input types) is created alone in a CPU session with the library. A node
    with none is no longer reported as runnable, and the report says which types it takes instead."""
    wanted = {(r.domain, r.op_type): r for r in reports}
    if not wanted:
        return
    types = _element_types(model)
    opsets = list(model.opset_import)
    answers: dict[tuple, str | None] = {}
    for node in iter_nodes(model.graph):
        report = wanted.get(("" if node.domain in STANDARD_DOMAINS else node.domain, node.op_type))
        if report is None:
            continue
        signature = tuple(types.get(name) if name else 0 for name in node.input)  # 0: an optional input left out
        if None in signature:
            continue  # a type this graph does not say
        report.element_types.update(_FLOATING[t] for t in signature if t in _FLOATING)
        attributes = tuple(a.SerializeToString(deterministic=True) for a in node.attribute)
        key = (node.domain, node.op_type, signature, attributes)  # one session per kind of node, not per node
        if key not in answers:
            answers[key] = _type_mismatch(node, signature, opsets)
        if answers[key] is not None and report.with_library:
            report.with_library = False
            report.how = answers[key]
            report.advice = (
                "cast the node's floating inputs to one type it takes (a Cast node before it); opbridge's exporter "
                "writes such casts for a mix of types (e.g. float32 rois, offsets or locations beside float16 "
                "features)"
            )


def _type_mismatch(node, signature: tuple[int, ...], opsets) -> str | None:
    """Why the library has no kernel for ``node`` with inputs of these element types, or None where it has one (or
    the node fails for another reason, which the whole model's session reports)."""
    error = _loads_alone(node, signature, opsets)
    if error is None or not any(text in error for text in TYPE_REFUSALS):
        return None
    names = ", ".join(f"{name}: {_type_name(t)}" for name, t in zip(node.input, signature, strict=True) if name)
    takes = [
        name
        for code, name in _FLOATING.items()
        if _loads_alone(node, tuple(code if t in _FLOATING else t for t in signature), opsets) is None
    ]
    if not takes:
        return f"{NO_KERNEL_FOR_TYPES} ({names})"
    takes_text = takes[0] if len(takes) == 1 else ", ".join(takes[:-1]) + " or " + takes[-1]
    return f"{NO_KERNEL_FOR_TYPES} ({names}); it takes every floating input {takes_text}"


def _type_name(code: int) -> str:
    import onnx

    return _FLOATING.get(code) or onnx.helper.tensor_dtype_to_np_dtype(code).name


def _loads_alone(node, signature: tuple[int, ...], opsets) -> str | None:
    """The error of a CPU session with the library of a graph of ``node`` alone, its inputs of these element types
    (no shapes); None where it loads."""
    import onnx
    from onnx import helper

    inputs = [f"input_{k}" if t else "" for k, t in enumerate(signature)]
    alone = helper.make_node(node.op_type, inputs, [f"output_{k}" for k in range(len(node.output))], domain=node.domain)
    alone.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [alone],
        "alone",
        [helper.make_tensor_value_info(name, t, None) for name, t in zip(inputs, signature, strict=True) if t],
        [onnx.ValueInfoProto(name=name) for name in alone.output],
    )
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 9)
    error = _try_session(model.SerializeToString(), True)
    return None if error == "loads" else error


def _schema_function_body(domain: str, op_type: str, opset: int) -> bool:
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _library_foreign_ops() -> dict[tuple[str, str], int]:
    try:
        return foreign_ops()
    except FileNotFoundError:
        return {}


def _library_ops() -> dict[str, int]:
    try:
        return ops()
    except FileNotFoundError:  # the report says the library's ops are missing; _try_session says why
        return {}


def iter_nodes(graph):
    """Every node of ``graph``, including those of its subgraphs (If, Loop, Scan bodies)."""
    for each in _graphs(graph):
        yield from each.node


def inspect_model(model) -> tuple[dict[str, int], list[OpReport]]:
    """Opset imports and one report per (domain, op type) of ``model`` (an onnx.ModelProto)."""
    opsets = {("" if e.domain in STANDARD_DOMAINS else e.domain): e.version for e in model.opset_import}
    local_functions = {(f.domain, f.name) for f in model.functions}
    kernels = _kernels()
    counts = collections.Counter(
        ("" if n.domain in STANDARD_DOMAINS else n.domain, n.op_type) for n in iter_nodes(model.graph)
    )
    for function in model.functions:
        counts.update(("" if n.domain in STANDARD_DOMAINS else n.domain, n.op_type) for n in function.node)
    reports = []
    for (domain, op_type), count in sorted(counts.items()):
        opset = opsets.get(domain)
        report = OpReport(domain, op_type, count, opset, False, False, "")
        ranges = kernels.get((domain, op_type), [])
        if (domain, op_type) == ("", "Constant"):
            report.without_library = report.with_library = True
            report.how = "turned into an initializer by the runtime"
        elif (domain, op_type) in local_functions:
            report.without_library = report.with_library = True
            report.how = "model-local ONNX function (inlined by the runtime)"
        elif (domain, op_type) in _library_foreign_ops():
            report.with_library = report.library = True
            report.how = f"{domain} node run by the opbridge library"
            report.advice = "load the opbridge library: opbridge_ort.InferenceSession(model)"
        elif (known := openmmlab.find(domain, op_type)) is not None:
            report.how = f"{domain} node the opbridge library does not run"
            if known.runs:  # in the table, not in this library: an older build
                report.advice = "this opbridge library predates its kernel: upgrade opbridge-ort"
            else:
                report.advice = f"{known.note} (written by {known.written_by}; see docs/openmmlab.md)"
        elif domain == DOMAIN:
            library_ops = _library_ops()
            implemented = ", ".join(sorted(library_ops)) or "no ops (library not found)"
            report.with_library = op_type in library_ops and opset is not None and opset >= library_ops[op_type]
            report.how = "opbridge custom op" if report.with_library else "not in this opbridge library"
            report.advice = (
                "load the opbridge library: opbridge_ort.InferenceSession(model) or "
                "options.register_custom_ops_library(opbridge_ort.library_path())"
                if report.with_library
                else f"this opbridge library implements {implemented}; upgrade opbridge, or re-export "
                "with lowering='standard'"
            )
        elif opset is not None and any(low <= opset <= high for low, high in ranges):
            report.without_library = report.with_library = True
            report.how = f"ONNX Runtime kernel ({domain or 'ai.onnx'} opset {opset})"
        elif opset is not None and _schema_function_body(domain, op_type, opset):
            report.without_library = report.with_library = True
            report.how = "expanded from its ONNX function body"
        elif ranges:
            versions = ", ".join(f"{low}..{high if high < 2**31 - 1 else 'newest'}" for low, high in sorted(ranges))
            report.how = f"no kernel at opset {opset}"
            report.advice = f"this onnxruntime has {op_type} kernels for opsets {versions}: re-export at one of them"
        elif domain in ("", "ai.onnx.ml", "com.microsoft"):
            report.how = "no kernel in this onnxruntime"
            report.advice = "upgrade onnxruntime, or re-export with an opset or lowering that avoids this op"
        else:
            report.how = f"unknown custom domain {domain!r}"
            report.advice = (
                f"ONNX Runtime reports '{domain}:{op_type} is not a registered function/op': an exporter rule "
                "emitted a custom node no runtime knows. Register a custom-op library that implements it, or "
                "re-export with a rule that emits standard ops (opbridge.onnx.export(..., lowering='standard'))"
            )
        reports.append(report)
    _check_element_types(model, [r for r in reports if r.with_library and _run_by_library(r)])
    cuda_nodes = _cuda_nodes()
    ort_cuda_kernels = _kernels("CUDAExecutionProvider") if _runtime_has_cuda() else None
    for report in reports:
        report.cuda = _cuda_column(report, cuda_nodes, ort_cuda_kernels)
    return opsets, reports


def _runtime_has_cuda() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _try_session(model_bytes: bytes, with_library: bool) -> str:
    import onnxruntime

    from . import session_options

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    if with_library:
        options = session_options(options)
    try:
        onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as error:
        return "fails: " + " ".join(str(error).split())[:300]
    return "loads"


DESCRIPTION = (
    "Lists a model's opsets and nodes by domain and says, for each op, whether the installed ONNX Runtime can "
    "run it without and with the opbridge library, and what to do when it cannot. Exit status: 0 if the model "
    "loads in ONNX Runtime with the opbridge library, 1 if it does not, 2 if the file is not an ONNX model."
)


def main(argv: list[str] | None = None, prog: str = "python -m opbridge inspect") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("model", help="path of an .onnx model")
    args = parser.parse_args(argv)

    import onnx
    import onnxruntime

    try:
        model = onnx.load(args.model, load_external_data=False)
    except Exception as error:
        print(f"cannot read {args.model} as an ONNX model: {error}", file=sys.stderr)
        return 2
    if model.ir_version == 0 or not model.HasField("graph"):  # e.g. an empty file parses as an empty message
        print(f"cannot read {args.model} as an ONNX model: it has no IR version or no graph", file=sys.stderr)
        return 2
    opsets, reports = inspect_model(model)
    print(
        f"{args.model}: IR version {model.ir_version}, producer {model.producer_name or '?'} {model.producer_version}"
    )
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(opsets.items())))
    if model.functions:
        print("functions: " + ", ".join(f"{f.domain}::{f.name}" for f in model.functions))
    print(f"onnxruntime {onnxruntime.__version__}\n")
    widths = (20, 22, 6, 8, 13, 5)
    header = ("domain", "op", "nodes", "ORT", "ORT+opbridge", "CUDA")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  how")
    for r in reports:
        row = (r.domain or "ai.onnx", r.op_type, str(r.count), _yes(r.without_library), _yes(r.with_library), r.cuda)
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + "  " + r.how)
    print(
        "\nCUDA: whether the node runs on ORT's CUDA execution provider (onnxruntime-gpu) with the opbridge library: "
        "yes; no (the CPU provider runs it, with copies to and from the GPU); ? (a standard op, and this "
        "onnxruntime has no CUDA provider to ask); - (it does not run at all)."
        + ("" if cuda_library_path() else " This opbridge_ort has no CUDA library (built without nvcc).")
    )
    advice = [r for r in reports if r.advice]
    if advice:
        print("\nwhat to do:")
        for r in advice:
            print(f"  {r.domain or 'ai.onnx'}::{r.op_type}: {r.advice}")
    data = model.SerializeToString() if not _has_external_data(model) else None
    runnable = all(r.with_library for r in reports)
    if data is not None:
        with_library = _try_session(data, True)
        print(f"\nsession without the opbridge library: {_try_session(data, False)}")
        print(f"session with the opbridge library:    {with_library}")
        if with_library != "loads":
            print("\nthe model does not load in this ONNX Runtime, even with the opbridge library", file=sys.stderr)
            runnable = False
    return 0 if runnable else 1


def _has_external_data(model) -> bool:
    return any(t.data_location == 1 for t in model.graph.initializer)


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"
