"""Memory and correctness diagnostics: the OOM frontier, leaks, loop hygiene, snapshots,
convergence parity.
"""
