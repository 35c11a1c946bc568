"""The private hooks into torch.onnx's dynamo exporter, in one place.

torch offers no public way to add export rules for every dynamo export
(``custom_translation_table`` is an argument of each call), so that plain
``torch.onnx.export(..., dynamo=True)`` knows opbridge's ops after
``import opbridge``, one private function is wrapped:

* ``torch.onnx._internal.exporter._compat.export_compat`` (what
  ``torch.onnx.export(dynamo=True)`` calls on torch 2.6 .. 2.15): opbridge's
  translations for the export's opset and the current lowering
  (:func:`opbridge.onnx.lowering`) are merged into its
  ``custom_translation_table``, the caller's own entries winning.

Two more wrappers only save time; without them exports are slower, not different:

* ``ONNXRegistry.from_torchlib`` re-parses ~500 onnxscript functions from
  source on every export (~0.7 s): it is built once per opset and copied;
* ``_decomp.create_onnx_friendly_decomposition_table`` is computed once per
  set of translated ops (and per size of torch's decomposition tables).

Nothing is imported here until torch imports those modules itself (a
post-import hook), so ``import opbridge`` stays light. If a future torch moves
``export_compat``, a warning says so and what to do instead;
tests/test_plain_export.py fails on that torch, and the matrix runs it on every
supported torch (``nox -t matrix``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType

COMPAT = "torch.onnx._internal.exporter._compat"
REGISTRATION = "torch.onnx._internal.exporter._registration"
DECOMPOSITION = "torch.onnx._internal.exporter._decomp"

#: hook name -> "installed" / "pending" (torch has not imported the module yet) / why it is missing
status: dict[str, str] = {}
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs callbacks right after torch imports one of the watched modules."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            with _lock:
                callbacks = _pending.pop(fullname, [])
            for callback in callbacks:
                callback(module)

        spec.loader.exec_module = exec_module  # this module's own loader object
        return spec


_FINDER = _PostImportFinder()


def _when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)


def install() -> None:
    """Called once by ``import opbridge``. ``OPBRIDGE_EXPORT_CACHE=0`` leaves out the two time savers (the
    benchmarks measure their effect with it; a way out should one ever misbehave)."""
    hooks = [(COMPAT, _patch_export)]
    if os.environ.get("OPBRIDGE_EXPORT_CACHE", "1") != "0":
        hooks += [(REGISTRATION, _patch_registry), (DECOMPOSITION, _patch_decomp)]
    for name, patch in hooks:
        status.setdefault(name, "pending")
        _when_imported(name, patch)
    _restore_rules_after_unregister()
    # torchvision registers its own TorchScript-exporter symbolics (roi_align, roi_pool, nms at opsets 11 and 16)
    # when torchvision.ops is imported; opbridge's rules for its ops must still win where they exist, whichever
    # of the two packages is imported first.
    _when_imported("torchvision.ops", _register_torchvision_rules)
    # torchvision's detectors branch on a data-dependent box count in batched_nms: torch.export stops there.
    _when_imported("torchvision.ops", _install_batched_nms)


def _restore_rules_after_unregister() -> None:
    """torch.onnx.unregister_custom_op_symbolic, then opbridge's rule back where it had one (see
    _legacy.restore_after_unregister): a user's symbolic registered over opbridge's and unregistered after an export,
    as mmdeploy's rewriters do, leaves opbridge's rule in place rather than torch's."""
    import torch.onnx

    original = torch.onnx.unregister_custom_op_symbolic
    if getattr(original, "_opbridge_restores", False):
        return

    @functools.wraps(original)
    def unregister_custom_op_symbolic(symbolic_name: str, opset_version: int) -> None:
        original(symbolic_name, opset_version)
        from . import _legacy

        _legacy.restore_after_unregister(symbolic_name, opset_version)

    unregister_custom_op_symbolic._opbridge_restores = True  # type: ignore[attr-defined]
    torch.onnx.unregister_custom_op_symbolic = unregister_custom_op_symbolic
    utils = sys.modules.get("torch.onnx.utils")
    if utils is not None and getattr(utils, "unregister_custom_op_symbolic", None) is original:
        utils.unregister_custom_op_symbolic = unregister_custom_op_symbolic


def _install_batched_nms(module: ModuleType) -> None:
    from . import _batched_nms

    _batched_nms.install(module)


def _register_torchvision_rules(module: ModuleType) -> None:
    from .. import specs
    from . import _legacy

    for spec in specs.all_specs():
        if spec.namespace == "torchvision":
            _legacy.register_symbolics(spec)


def _missing(name: str, what: str, consequence: str) -> None:
    import torch

    status[name] = f"missing: {what}"
    if consequence:
        warnings.warn(
            f"opbridge cannot hook into torch {torch.__version__}'s dynamo exporter ({what}). {consequence}",
            RuntimeWarning,
            stacklevel=2,
        )


# --- the export rules --------------------------------------------------------------------------------------------


def _patch_export(module: ModuleType) -> None:
    original = getattr(module, "export_compat", None)
    try:
        signature = inspect.signature(original)
        parameters = signature.parameters
        usable = "custom_translation_table" in parameters and "opset_version" in parameters
    except (TypeError, ValueError):
        usable = False
    if not usable:
        _missing(
            COMPAT,
            f"{COMPAT}.export_compat with custom_translation_table and opset_version not found",
            "Plain torch.onnx.export(..., dynamo=True) will not know opbridge's ops: use "
            "opbridge.onnx.export(...), or pass custom_translation_table=opbridge.onnx.translation_table(lowering, "
            "opset) to torch.onnx.export.",
        )
        return
    if getattr(original, "__opbridge_wrapped__", False):
        return
    # torch 2.6 defaults opset_version to None, meaning torchlib's opset (18); later ones to their default opset.
    default_opset = parameters["opset_version"].default

    @functools.wraps(original)
    def export_compat(*args, **kwargs):
        from ._dynamo import translation_table
        from ._state import current_lowering

        bound = signature.bind(*args, **kwargs)
        opset = bound.arguments.get("opset_version", default_opset)
        if opset is None:
            opset = default_opset if default_opset is not None else 18
        table = translation_table(None, opset)
        table.update(bound.arguments.get("custom_translation_table") or {})  # the caller's entries win
        bound.arguments["custom_translation_table"] = table
        if current_lowering() != "function":
            program = original(*bound.args, **bound.kwargs)
            if _drop_unexported(program) and bound.arguments.get("f") is not None:
                _save_like_torch(program, bound.arguments["f"], bound.arguments)  # torch saved the placeholders
            return program
        # Function calls need their definitions in the model before torch saves it.
        destination = bound.arguments.pop("f", None)
        program = original(*bound.args, **bound.kwargs)
        _drop_unexported(program)
        _attach_functions(program)
        if destination is not None:
            _save_like_torch(program, destination, bound.arguments)
        return program

    export_compat.__opbridge_wrapped__ = True
    module.export_compat = export_compat
    status[COMPAT] = "installed"


def _drop_unexported(program) -> bool:
    """Removes the placeholders of unused outputs that have no ONNX form; raises if the model uses one.
    Returns whether the model changed."""
    from ..specs import LoweringError
    from ._schemas import UNEXPORTED_DOMAIN

    model = getattr(program, "model", None)
    graph = getattr(model, "graph", None)
    if graph is None:
        return False
    placeholders = [node for node in graph if node.domain == UNEXPORTED_DOMAIN]
    for node in placeholders:
        output = node.outputs[0]
        if output.uses() or output in graph.outputs:
            why = node.attributes["why"].value if "why" in node.attributes else node.op_type
            raise LoweringError(f"the model uses an output that has no ONNX form: {why}")
        graph.remove(node, safe=True)
    if UNEXPORTED_DOMAIN in model.opset_imports:
        del model.opset_imports[UNEXPORTED_DOMAIN]
        return True
    return bool(placeholders)


def _attach_functions(program) -> None:
    """Adds the definitions of the opbridge functions the program's model calls."""
    import importlib

    from . import functions

    model_proto = program.model_proto
    before = len(model_proto.functions)
    functions.attach(model_proto)
    if len(model_proto.functions) != before:
        # The program keeps an IR model (onnx_ir, or onnxscript.ir on older torch): rebuild it from the proto.
        serde = importlib.import_module(type(program.model).__module__.rsplit(".", 1)[0] + ".serde")
        program.model = serde.deserialize_model(model_proto)


def _save_like_torch(program, destination, arguments: dict) -> None:
    if isinstance(destination, (str, os.PathLike)):
        program.save(
            destination,
            include_initializers=arguments.get("export_params", True),
            keep_initializers_as_inputs=arguments.get("keep_initializers_as_inputs", False),
            external_data=arguments.get("external_data", True),
        )
    else:  # a binary file object, which torch accepts (deprecated)
        destination.write(program.model_proto.SerializeToString())


# --- time savers -------------------------------------------------------------------------------------------------


def _patch_registry(module: ModuleType) -> None:
    registry_class = getattr(module, "ONNXRegistry", None)
    original = registry_class.__dict__.get("from_torchlib") if registry_class is not None else None
    if not isinstance(original, classmethod) or getattr(original.__func__, "__opbridge_wrapped__", False):
        if not isinstance(original, classmethod):
            _missing(REGISTRATION, "ONNXRegistry.from_torchlib not found; exports are slower", "")
        return
    build = original.__func__
    built: dict = {}

    @functools.wraps(build)
    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        with _lock:
            base = built.get(key)
        if base is None:
            base = build(cls, *args, **kwargs)
            with _lock:
                built[key] = base
        # A copy: every export registers its own custom translations into the registry it gets.
        registry = cls.__new__(cls)
        registry.__dict__.update(base.__dict__)
        registry.functions = {target: list(decompositions) for target, decompositions in base.functions.items()}
        return registry

    from_torchlib.__opbridge_wrapped__ = True
    registry_class.from_torchlib = classmethod(from_torchlib)
    status[REGISTRATION] = "installed"


def _patch_decomp(module: ModuleType) -> None:
    original = getattr(module, "create_onnx_friendly_decomposition_table", None)
    if original is None or getattr(original, "__opbridge_wrapped__", False):
        if original is None:
            _missing(DECOMPOSITION, "create_onnx_friendly_decomposition_table not found; exports are slower", "")
        return
    computed: dict = {}

    @functools.wraps(original)
    def create_onnx_friendly_decomposition_table(onnx_registered_ops):
        import torch

        # New decompositions, or op libraries loaded since, change the table: they are part of the key.
        key = (frozenset(onnx_registered_ops), len(torch._decomp.decomposition_table), len(torch.ops.loaded_libraries))
        with _lock:
            table = computed.get(key)
        if table is None:
            table = original(onnx_registered_ops)
            with _lock:
                computed[key] = table
        return dict(table)

    create_onnx_friendly_decomposition_table.__opbridge_wrapped__ = True
    module.create_onnx_friendly_decomposition_table = create_onnx_friendly_decomposition_table
    status[DECOMPOSITION] = "installed"


# --- the TorchScript-based exporter: torch's own rule of an op ---------------------------------------------------

_LEGACY_REGISTRATIONS = ("torch.onnx._internal.torchscript_exporter.registration", "torch.onnx._internal.registration")


def legacy_builtin_versions(name: str) -> list[int]:
    """The opsets at which torch (or torchvision) registered its own symbolic of ``name``; [] if unknown.
    torch registers its symbolics when its symbolic_opsetN modules are imported (at the first export): import
    them now."""
    import contextlib
    import importlib

    for version in range(7, 21):
        with contextlib.suppress(ImportError):
            importlib.import_module(f"torch.onnx.symbolic_opset{version}")

    for module_name in _LEGACY_REGISTRATIONS:
        try:
            registration = importlib.import_module(module_name)
            group = registration.registry.get_function_group(name)
            return sorted(group._functions._base) if group is not None else []
        except (ImportError, AttributeError, TypeError):
            continue
    return []


def legacy_builtin_symbolic(name: str, opset: int) -> Callable | None:
    """torch's own symbolic of ``name`` ("aten::log1p") for ``opset``, ignoring custom ones (opbridge's), or
    None. Used where an opbridge mapping has no lowering at the opset being exported, so that the exporter's
    own rule applies as it would without opbridge. The registry is private (its module moved in torch 2.9):
    on a torch where it cannot be read, the caller reports that no rule applies."""
    import importlib

    for module_name in _LEGACY_REGISTRATIONS:
        try:
            registration = importlib.import_module(module_name)
            group = registration.registry.get_function_group(name)
            base = group._functions._base if group is not None else {}
            version = registration._dispatch_opset_version(opset, base)
        except (ImportError, AttributeError, TypeError):
            continue
        return base.get(version) if version is not None else None
    return None
