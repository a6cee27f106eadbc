"""The measurement protocol and the record it writes: timing, memory, FLOPs, telemetry, traces, the
machine, the journal of finished cases.
"""
