"""tdrl's benchmarks: each module measures tdrl beside the peer a user would otherwise pick, on
the same work, and stores its rows with :func:`benchmarks.records.write_record`.

Run them from the repository root as modules, ``python -m benchmarks.<name> [--help]``; the
shared helpers (records, the machine's description, the repository root) are in
``benchmarks/records.py``. ``benchmarks/RESULTS.md`` is generated from ``benchmarks/results/``
by ``python -m benchmarks.make_results``.
"""
