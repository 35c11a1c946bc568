"""Export rules for the TorchScript-based exporter (torch.onnx.export(..., dynamo=False)).

One symbolic per op is registered with torch.onnx.register_custom_op_symbolic
(public, and cheap: ``import opbridge`` does it); it picks the spec's lowering
for the opset being exported and the current lowering kind
(:func:`opbridge.onnx.lowering`, ``standard`` by default).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import torch

from .. import specs
from . import _torch_hooks
from ._state import current_lowering, functions_attached
from .builder import LegacyBuilder

#: The lowest opset opbridge exports with the TorchScript-based exporter. torch accepts 7 and 8 too, but its
#: dispatch of custom symbolics below 9 is inconsistent (a rule registered for 7 is refused at 8), and opsets
#: below 9 predate most of ONNX; the matrix measures 9 .. the exporter's newest.
MIN_OPSET = 9


class FallbackWarning(UserWarning):
    """A node opbridge maps was exported by torch's own rule instead (see :class:`opbridge.specs.UnknownToExporter`):
    the model exports as it does without opbridge, without what opbridge's rule fixes."""


def symbolic_for(name: str) -> Callable:
    torch_op = specs.get(name).torch_op

    def symbolic(g, *args):
        # The op's spec now, not at registration: register_mapping(..., override=True) may have replaced it.
        spec = next(s for s in reversed(specs.all_specs()) if s.torch_op == torch_op)
        try:
            lowering = spec.lowering(current_lowering(), g.opset)
        except specs.LoweringError:
            # No opbridge lowering at this opset: torch's own rule, where it has one (as without opbridge).
            builtin = _torch_hooks.legacy_builtin_symbolic(spec.symbolic_name, g.opset)
            if builtin is None or spec.namespace == "opbridge":
                raise
            return builtin(g, *args)
        if lowering.kind == "function" and not functions_attached.get():
            raise specs.LoweringError(
                f"{spec.torch_op}: the 'function' lowering with torch.onnx.export(..., dynamo=False) would write a "
                "model that calls an ONNX function without its definition (the TorchScript-based exporter cannot "
                "add it). Export with opbridge.onnx.export(model, args, f, dynamo=False, lowering='function'), "
                "or with dynamo=True."
            )
        try:
            return lowering.build(LegacyBuilder(g), *args)
        except specs.UnknownToExporter as error:
            # The exporter knows too little here (a dtype lost in a loop block, an unknown rank): torch's own rule,
            # where it has one, exports the node as it does without opbridge. Nodes the lowering added before it
            # gave up have no users and are removed by the exporter's dead-code pass.
            builtin = _torch_hooks.legacy_builtin_symbolic(spec.symbolic_name, g.opset)
            if builtin is None or spec.namespace == "opbridge":
                raise
            warnings.warn(
                f"opbridge: {spec.torch_op} at opset {g.opset} is exported by torch's own rule, as without opbridge, "
                f"because opbridge's rule cannot apply here: {error}",
                FallbackWarning,
                stacklevel=2,
            )
            return builtin(g, *args)

    symbolic.__name__ = f"{name}_symbolic"
    return symbolic


def registration_opsets(spec: specs.OpSpec) -> tuple[int, ...]:
    """The opsets opbridge registers the spec's symbolic at. The exporter dispatches to the rule registered at the
    highest opset <= the one exported, so a builtin rule registered at a later opset (grid_sampler's at 16) would
    shadow opbridge's above it: registered at those opsets too. Where the spec has no lowering, the symbolic calls
    the builtin rule itself."""
    minimum = max(MIN_OPSET, min(lw.min_opset for lw in spec.lowerings))
    later = [v for v in _torch_hooks.legacy_builtin_versions(spec.symbolic_name) if v > minimum]
    return (minimum, *later)


def register_symbolics(only: specs.OpSpec | None = None, opset: int | None = None) -> None:
    """Registers the symbolics (of `only`, else of every spec), at every registration opset or only at `opset`."""
    for spec in [only] if only is not None else specs.all_specs():
        for version in registration_opsets(spec):
            if opset is None or version == opset:
                torch.onnx.register_custom_op_symbolic(spec.symbolic_name, symbolic_for(spec.name), version)


def restore_after_unregister(symbolic_name: str, opset: int) -> None:
    """After torch.onnx.unregister_custom_op_symbolic(symbolic_name, opset): opbridge's rule for that op and opset,
    where it had one, comes back. A symbolic registered over opbridge's (mmdeploy's rewriters do so around each
    export) replaces it, and unregistering that one would otherwise leave torch's builtin rule for the rest of the
    process; a registration the user still holds at another opset is left alone."""
    for spec in specs.all_specs():
        if spec.symbolic_name == symbolic_name and opset in registration_opsets(spec):
            if spec.namespace == "torchvision" and "torchvision.ops" not in sys.modules:
                continue  # registered when torchvision.ops is imported (_torch_hooks)
            register_symbolics(spec, opset)


def max_opset() -> int:
    from torch.onnx import _constants

    return getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _constants.ONNX_MAX_OPSET)
