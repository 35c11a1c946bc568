"""Fuzz targets, one module per op (``<op>.py``, named after the torch op), run by tests/fuzz.py, which finds
every module here (names starting with an underscore are helpers) and keeps no list of ops.

A module declares:

``ORT_NODE``
    The op type of the op's node in the opbridge domain (e.g. ``"MyAdd"``): the target ``ort.<ORT_NODE>``
    builds one-node models of it for the ORT library, with onnxruntime, onnx and numpy only (no torch).
    ``None``: the op has no ORT target.
``ORT_DOMAIN`` (optional, default ``"opbridge"``)
    The node's domain when the op is another project's node (e.g. ``"mmdeploy"`` for ``grid_sampler``): the
    target is then ``ort.<ORT_DOMAIN>.<ORT_NODE>``.
``ORT_ALIASES`` (optional)
    ``"domain::op_type"`` of the other nodes the library runs with the same kernel and checks as this target's
    (e.g. mmcv's name of the same node): the fuzzing of this target covers them.
``config(rng, kind) -> dict``
    A configuration drawn from ``rng`` (a numpy Generator) for the target of ``kind``, ``"ort"`` or
    ``"torch"``: usually valid, often mutated into a hostile one. It must be JSON-printable with
    ``default=str`` (``--replay`` prints it).
``run_ort(session, rng, cfg) -> (outcome, detail)``
    Builds the model (``_common.one_node_model``), gets an ``onnxruntime.InferenceSession`` of it with the
    library registered from ``session(model)``, draws the inputs from ``rng`` and runs it.
``run_torch(rng, cfg) -> (outcome, detail)`` (absent for a node with no torch op of opbridge's)
    Calls ``torch.ops.opbridge.<op>`` (the target ``torch.<op>``); the driver imported torch and opbridge.

Both run functions import what they need themselves (no torch at the top of a module) and return
``("match", "")`` when the op ran, the configuration is valid by the module's own predicate (written from the
op's definition, not from the C++ checks) and the output equals the module's numpy reference;
``("rejected", message)`` when the op raised (``_common.rejected``); ``("mismatch", why)`` for wrong values or an
invalid configuration accepted (``_common.INVALID_ACCEPTED``). A crash or hang is the driver's to notice.
Each case is generated from (seed, target, case number) alone: draw only from ``rng``.
"""
