"""Helpers shared by the fuzz targets: random cases, outcomes, comparisons, one-node models (numpy only at import:
onnx, onnxruntime and torch load where a target needs them)."""

from __future__ import annotations

import numpy as np

HUGE = [2**31 - 1, 2**31, 2**32 + 1, 2**62, 2**63 - 1]
# Set by --no-huge-allocations: under AddressSanitizer a failing `operator new` (in the runtime, for an output
# of terabytes) aborts instead of throwing std::bad_alloc, so those cases run only without ASan.
NO_HUGE = "OPBRIDGE_FUZZ_NO_HUGE_ALLOCATIONS"
#: ONNX element types of the numpy dtypes the targets declare.
ELEMENT_TYPES = {np.float32: 1, np.float64: 11, np.float16: 10, np.int32: 6, np.int64: 7, np.uint8: 2, np.bool_: 9}

MATCH = ("match", "")
INVALID_ACCEPTED = ("mismatch", "an invalid configuration was accepted")


def case_rng(seed: int, target: str, case: int) -> np.random.Generator:
    return np.random.default_rng([seed, sum(map(ord, target)) * 7919 + len(target), case])


def chance(rng, p: float) -> bool:
    return bool(rng.random() < p)


def random_values(rng, shape, dtype, special: bool, huge: bool = True):
    """Normal values; with `special`, a tenth of them NaN, +-inf, -0.0 or (with `huge`) 1e30."""
    values = rng.standard_normal(shape) * 3 if all(d >= 0 for d in shape) else np.zeros(0)
    if special and values.size:
        flat = values.reshape(-1)
        picks = rng.integers(0, flat.size, size=max(1, flat.size // 10))
        flat[picks] = rng.choice([np.nan, np.inf, -np.inf, -0.0] + ([1e30] if huge else []), size=picks.size)
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dtype)


def rejected(error: Exception) -> tuple[str, str]:
    """The outcome of an op that raised (an ORT error status or a Python exception)."""
    return "rejected", str(error)[:200]


def same_values(got, want) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return bool(np.array_equal(got, want, equal_nan=True))


def close_values(got, want, dtype) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    # float16: the op's float32 arithmetic rounded once (a half ulp, 2^-11) against a float64 reference
    tol = {np.float16: 2e-3, np.float32: 1e-4}.get(dtype, 1e-10)
    return bool(np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True))


def to_torch(array):
    """A tensor of the array's exact shape (np.ascontiguousarray would turn a 0-d array into shape (1,))."""
    import torch

    return torch.from_numpy(np.array(array, order="C", copy=True))


def tensor_info(name: str, dtype):
    """An input or output of unknown shape (the op must check every shape itself)."""
    from onnx import helper

    return helper.make_tensor_value_info(name, ELEMENT_TYPES[dtype], None)


def one_node_model(node, inputs, outputs) -> bytes:
    """A model of one node (in the opbridge domain or another), built as the ORT smoke cases build theirs."""
    from ort_cases._common import one_node_model as build

    return build(node, inputs, outputs, domains=(node.domain,))


def ort_session(library: str, model: bytes):
    """`model` in ONNX Runtime with the opbridge library registered, on two threads, with a quiet log (rejections
    are expected)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 4
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run_one_node(session, op_type: str, inputs: list[str], arrays: dict, attributes: dict, out_dtype,
                 domain: str = "opbridge", outputs=None):  # fmt: skip
    """Builds the one-node model of ``domain::op_type`` over ``inputs`` (names into ``arrays``; empty names and
    repeats as the case drew them), runs it, and returns ``(output, None)``, or ``(None, rejected(error))`` when
    the runtime refused the model or the inputs. ``outputs``: the dtypes of several outputs (then ``output`` is
    their list)."""
    from onnx import helper

    dtypes = [out_dtype] if outputs is None else list(outputs)
    names_out = [f"out{i}" if i else "out" for i in range(len(dtypes))]
    node = helper.make_node(op_type, inputs, names_out, domain=domain, **attributes)
    names = [n for n in dict.fromkeys(inputs) if n]
    model = one_node_model(node, [tensor_info(n, arrays[n].dtype.type) for n in names],
                           [tensor_info(n, d) for n, d in zip(names_out, dtypes, strict=True)])  # fmt: skip
    try:
        results = session(model).run(None, {n: arrays[n] for n in names})
    except Exception as error:
        return None, rejected(error)
    return (results[0] if outputs is None else results), None
