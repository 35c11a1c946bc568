"""ORT smoke cases, one module per op (``<op>.py``, each with a ``CHECKS`` list), run by
tests/ort_smoke.py with nothing but onnxruntime, onnx and numpy."""
