"""The version of the record gpubench writes (``extra_info["schema"]``).

Raise it when a record's fields change meaning or a field every record had is dropped; the
reader (``gpubench.analysis.results.upgrade``) then brings records of every earlier version to
this one, in one place.

- 0: records written before the version existed (no ``schema`` field): ``kind`` may be missing
  (a benchmark case), ``workload`` may be missing (the spec was the ``model``), and techniques
  added since are missing (their default).
- 1: every record has ``schema``, ``kind`` and ``workload``.
- 2: ``fp8_gemm_flops_fraction`` (float8 FLOPs over the GEMM FLOPs) replaces
  ``fp8_flops_fraction`` (over all counted FLOPs).
"""

SCHEMA_VERSION = 2
