"""Chunked fused LM head + token log-probs with O(chunk x V) memory.

The public ops and their ``*_reference`` twins live in :mod:`.api` and are exported from
:mod:`tdrl.kernels` (their one export list).
"""
