"""opbridge's tools: what ``python -m opbridge COMMAND`` runs, next to (not part of) the library.

``parity`` (the parity matrix), ``bench`` (the benchmarks: a harness and one module per op), ``catalog`` (the
table of ops, docs/ops.md), ``coverage`` (the sweep of PyTorch's op database), ``models`` (the model sweep) and
``compatibility`` (docs/compatibility.md from the matrix's reports). Nothing is imported here: each tool loads
what it needs when it runs.
"""
