"""Helpers shared by the per-op ORT smoke cases (no torch, no pytest, no opbridge package)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

DTYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int32: TensorProto.INT32,
}


def one_node_model(node, inputs, outputs, opset: int = 17, domains=("opbridge",)) -> bytes:
    """A model of one node in a custom domain, readable by every ORT from 1.16 on (IR 8)."""
    graph = helper.make_graph([node], node.op_type, list(inputs), list(outputs))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(domain, 1) for domain in domains]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model.SerializeToString()


def session(library: str, model: bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def expect_error(call, *fragments: str) -> str:
    try:
        call()
    except Exception as error:  # ORT raises its own exception types per version
        message = str(error)
        missing = [f for f in fragments if f not in message]
        if missing:
            raise AssertionError(f"error message lacks {missing}: {message}") from None
        return message
    raise AssertionError("expected an error, got none")
