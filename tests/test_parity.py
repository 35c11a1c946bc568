"""The parity matrix's sharing within a group of cells (opbridge.tools.parity.Shared): the same results and models
as every cell on its own, with the dynamo exporter's decomposition done once per captured program."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import opbridge
from opbridge import specs
from opbridge.tools import parity

NEWEST_DYNAMO_OPSET = max(opbridge.onnx.supported_opsets(dynamo=True))


def _outcome(result: parity.CellResult) -> tuple:
    cases = [(s.operands, s.batch, s.passed, s.max_error, s.detail) for s in result.subresults]
    return result.cell, result.status, result.max_error, result.reason, cases


@pytest.mark.parametrize("exporter", parity.EXPORTERS)
def test_a_group_gives_what_its_cells_give_on_their_own(exporter):
    opsets = [18, parity.matrix_opsets(exporter)[-1]]
    selected = parity.cells(["my_add"], [exporter], ["standard", "custom"], opsets, ["float32"], ["torch.ops"])
    assert len(selected) == 4, selected
    grouped = parity.run_group(selected)
    alone = parity.run_group(selected, share=False)
    assert [_outcome(r) for r in grouped] == [_outcome(r) for r in alone]
    assert all(r.status == "pass" for r in grouped), [r.detail for r in grouped]


def test_the_dynamo_decomposition_is_done_once_per_captured_program():
    """my_add's registry sets differ between opset 18 and the newest (torch adds rules at 23) but my_add's graph
    uses none of the extra ops: the newest opset's decomposition serves every cell."""
    selected = parity.cells(["my_add"], ["dynamo"], ["standard", "custom", "function"], [18, NEWEST_DYNAMO_OPSET],
                            ["float32"], ["torch.ops"])  # fmt: skip
    results = parity.run_group(selected)
    assert all(r.status == "pass" for r in results), [r.detail for r in results]
    programs = len(results[0].subresults)  # one per operand kind and batch kind
    decompositions = sum("decompose" in case.seconds for r in results for case in r.subresults)
    assert decompositions == programs, f"{decompositions} decompositions for {programs} captured programs"


def test_a_shared_dynamo_export_is_byte_for_byte_the_export_of_the_module():
    spec = specs.get("my_add")
    shared = parity.Shared()
    for lowering in ("standard", "custom", "function"):
        for opset in (NEWEST_DYNAMO_OPSET, 18):
            cell = parity.Cell("my_add", "torch.ops", "dynamo", lowering, opset, "float32")
            for batch in ("static", "dynamic"):
                case = shared.case(spec, cell, spec.operand_kinds[0], batch)
                key = parity._subcase_key(cell, spec.operand_kinds[0], batch)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the exporter's advice, as in the matrix
                    model = parity._export_dynamo(shared, key, case, case.export_inputs, cell, parity._Clock())
                    fresh = parity._export(case.module, case.export_inputs, cell, dict(case.kwargs))
                assert model.SerializeToString() == fresh.SerializeToString(), (cell, batch)
    assert len(shared.programs) == 2, "the static and the dynamic batch's programs, captured once each"


def test_a_data_dependent_program_is_captured_again_for_a_new_decomposition():
    """nms_rotated's output size depends on the data, and decomposing its captured program a second time fails in
    torch: a cell that needs a decomposition for a new set of ops (opset 23's, after opset 22's) exports from the
    module again."""
    shared = parity.Shared()
    results = [
        parity.run_cell(parity.Cell("nms_rotated", "torch.ops", "dynamo", "custom", opset, "float32"), shared)
        for opset in (22, 23)  # oldest first: the second cell's registry has rules for more ops
    ]
    assert [r.status for r in results] == ["pass", "pass"], [r.detail for r in results]
    assert all("decompose" in case.seconds for case in results[1].subresults), "opset 23 reused opset 22's"


def test_the_report_says_where_the_time_went():
    results = parity.run_group(parity.cells(["my_add"], ["legacy"], ["standard"], [17], ["float32"], ["torch.ops"]))
    case = results[0].subresults[0]
    assert set(case.seconds) <= set(parity.PHASES) and {"inputs", "export", "session", "run"} <= set(case.seconds)
    assert all(seconds >= 0 for seconds in case.seconds.values())
    totals = parity.phases(results)["legacy"]
    assert totals["export"] > 0 and "legacy" in parity.phase_summary(results)
    document = parity.to_json(results)[0]["cases"][0]
    assert set(document["seconds"]) == set(case.seconds)


@pytest.mark.parametrize("release", ["1.16.3", "1.20.1", "1.23.2", "1.24.4"])
def test_fused_matmul_without_float64_is_a_gap_of_the_releases_that_lack_it(monkeypatch, release):
    """ORT 1.16 to 1.24 fuse Transpose + MatMul into FusedMatMul, which has no float64 kernel (both messages, as the
    matrix's 1.16.3, 1.20.1, 1.23 and 1.24.4 cells gave them, 2026-11-27): n/a there, with the workaround named; the
    same message under 1.32 (which runs those models) stays a failure, and so does any other failure beside it."""
    import onnxruntime

    messages = [
        "NotImplemented: Failed to find kernel for com.microsoft.FusedMatMul(1) (node:'/MatMul/Fusion/')",
        "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Failed to find kernel for FusedMatMul(1) "
        "(node MatMul_With_Transpose). Op with name (MatMul_With_Transpose) domain (com.microsoft)",
    ]
    subresults = [parity.SubResult("same", "static", False, None, message) for message in messages]
    monkeypatch.setattr(onnxruntime, "__version__", release)
    assert "ONNX Runtime 1.16 to 1.24" in parity._environment_gap(subresults)
    other = [*subresults, parity.SubResult("broadcast", "static", False, 0.5, "max error 0.5")]
    assert parity._environment_gap(other) == ""
    monkeypatch.setattr(onnxruntime, "__version__", "1.32.0")
    assert parity._environment_gap(subresults) == ""


# --- half-precision cells: ONNX Runtime's output against the float64 value ---------------------------------------


def _half_cell(dtype: str) -> parity.Cell:
    return parity.Cell("my_add", "torch.ops", "legacy", "standard", 17, dtype)


@pytest.mark.parametrize("dtype", parity.HALF)
def test_a_half_cell_passes_one_rounding_of_the_float64_value_and_nothing_more(dtype):
    import torch

    torch_dtype = getattr(torch, dtype)
    spec = specs.get("my_add")
    want = torch.linspace(-3, 3, 301, dtype=torch.float64) * torch.pi  # not representable: every value rounds
    rounded = want.to(torch_dtype)
    assert parity._compare([rounded], [want], spec, _half_cell(dtype), "same", "static").passed
    # What a float32 kernel gives: the float32 value rounded (a double rounding, within the float32 allowance).
    via_float32 = want.to(torch.float32).to(torch_dtype)
    assert parity._compare([via_float32], [want], spec, _half_cell(dtype), "same", "static").passed
    # The neighbour of the rounded value on the far side: within a unit of the value, yet not its rounding.
    step = (rounded.double() - want).sign()
    unit = parity.UNIT_ROUNDOFF[dtype]
    neighbour = (rounded.double() * (1 + 2 * unit * step)).to(torch_dtype)
    moved = neighbour != rounded
    assert moved.any()
    result = parity._compare([neighbour[moved]], [want[moved]], spec, _half_cell(dtype), "same", "static")
    assert not result.passed, "a value one step past its rounding must fail"
    wrong = (want * (1 + 3 * unit)).to(torch_dtype)  # ~3 units away: more than any one rounding
    result = parity._compare([wrong], [want], spec, _half_cell(dtype), "same", "static")
    assert not result.passed and "from the float64 value" in result.detail


@pytest.mark.parametrize("dtype", parity.HALF)
def test_a_half_cell_wants_the_half_dtype_back_and_agrees_on_nan_and_infinity(dtype):
    import torch

    torch_dtype = getattr(torch, dtype)
    spec = specs.get("my_add")
    want = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0], dtype=torch.float64)
    result = parity._compare([want.float()], [want], spec, _half_cell(dtype), "same", "static")
    assert not result.passed and f"expected {dtype}[5]" in result.detail
    assert parity._compare([want.to(torch_dtype)], [want], spec, _half_cell(dtype), "same", "static").passed
    # An expected infinity or NaN is met by the same value only: each wrong value alone must fail.
    for index, wrong in ((1, 0.0), (2, -float("inf")), (2, 65504.0), (2, float("nan")), (3, float("inf"))):
        got = want.clone()
        got[index] = wrong
        result = parity._compare([got.to(torch_dtype)], [want], spec, _half_cell(dtype), "same", "static")
        assert not result.passed, (index, wrong)
    indices = torch.tensor([3, 1, 2, 4000])  # integer outputs of a half cell: exact, in their own dtype
    assert parity._compare([indices], [indices.clone()], spec, _half_cell(dtype), "same", "static").passed
    for index in range(4):
        off = indices.clone()
        off[index] += 1
        assert not parity._compare([off], [indices], spec, _half_cell(dtype), "same", "static").passed


def test_bfloat16_goes_in_and_out_of_onnx_runtime_bit_for_bit():
    """numpy has no bfloat16: parity feeds ORT the bits and reads them back (ort_run); a Cast to float32 and back
    must return every bit pattern it was given, NaN and infinities included, at a size ORT decides (dynamic)."""
    import onnxruntime
    import torch
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["wide"], ["y"], to=TensorProto.BFLOAT16)]  # fmt: skip
    info = lambda name: helper.make_tensor_value_info(name, TensorProto.BFLOAT16, None)  # noqa: E731
    graph = helper.make_graph(nodes, "g", [info("x")], [info("y"), helper.make_tensor_value_info("wide", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bits = torch.arange(-(2**15), 2**15, 37, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(-1, 1)
    x = x[~x.isnan().squeeze(1)]  # a NaN's payload may change in the casts; its NaN-ness must not
    y, wide = parity.ort_run(session, {"x": x})
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))
    assert torch.equal(wide, x.float())
    nan = parity.ort_run(session, {"x": torch.tensor([[float("nan")]], dtype=torch.bfloat16)})[0]
    assert nan.isnan().all()
    empty = parity.ort_run(session, {"x": torch.zeros(0, 3, dtype=torch.bfloat16)})[0]
    assert empty.shape == (0, 3) and empty.dtype == torch.bfloat16


def test_half_cells_exist_for_every_op_and_mapping_with_floating_inputs():
    """Every spec whose dtypes include float32 has float16 and bfloat16 cells (n/a with a reason where the runtime
    cannot run them): the issue's 'half cells for every op and mapping'."""
    import torch

    for spec in specs.builtin_specs():
        if torch.float32 in spec.dtypes:
            assert {torch.float16, torch.bfloat16} <= set(spec.dtypes), spec.name


def test_a_bfloat16_cell_below_opset_13_is_not_applicable_with_its_reason():
    cell = parity.Cell("my_add", "torch.ops", "legacy", "standard", 9, "bfloat16")
    failed = [parity.SubResult("same", "static", False, None, "InvalidGraph: Type 'tensor(bfloat16)' is invalid")]
    assert "opset 13" in parity._dtype_gap(specs.get("my_add"), cell, failed)
    # A wrong value or dtype is a failure there too (the custom node runs bfloat16 at any opset).
    wrong_value = [*failed, parity.SubResult("same", "dynamic", False, 0.5, "max error 0.5 from the float64 value")]
    assert parity._dtype_gap(specs.get("my_add"), cell, wrong_value) == ""
    wrong_dtype = [parity.SubResult("same", "static", False, None, "ORT gave float32[2, 3], expected bfloat16[2, 3]")]
    assert parity._dtype_gap(specs.get("my_add"), cell, wrong_dtype) == ""
    # A torch or torchvision kernel without a half kernel, traced by the TorchScript-based exporter: a gap of the
    # mapped op, never of opbridge's own ops (which take every half dtype).
    traced = [parity.SubResult("same", "static", False, None, "RuntimeError: \"x\" not implemented for 'BFloat16'")]
    at13 = dataclasses.replace(cell, opset=13)
    assert parity._dtype_gap(specs.get("my_add"), at13, traced) == ""
    sinh13 = parity.Cell("sinh", "torch", "legacy", "standard", 13, "bfloat16")
    assert "runs the model to trace it" in parity._dtype_gap(specs.get("sinh"), sinh13, traced)
    # torch's own dynamo rule lacking ORT kernels is n/a only where torch's rule runs (not opbridge's own ops).
    no_kernel = [parity.SubResult("same", "static", False, None, "Could not find an implementation for Sinh(9)")]
    sinh = parity.Cell("sinh", "torch", "dynamo", "standard", 18, "bfloat16")
    assert "torch's own dynamo rule" in parity._dtype_gap(specs.get("sinh"), sinh, no_kernel)
    ours = parity.Cell("my_add", "torch.ops", "dynamo", "standard", 18, "bfloat16")
    assert parity._dtype_gap(specs.get("my_add"), ours, no_kernel) == ""
    wrong = [parity.SubResult("same", "static", False, 0.5, "max error 0.5 from the float64 value")]
    assert parity._dtype_gap(specs.get("sinh"), sinh, wrong) == ""
