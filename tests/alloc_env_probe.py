"""A spawned process's view of its environment when its entry point is imported
(``tests/test_expandable_segments.py``). Deliberately light: it imports no torch, so the probe
can tell whether anything imported torch before it."""

import os
import sys


def report(conn) -> None:
    conn.send({"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
               "torch_imported": "torch" in sys.modules})
    conn.close()
