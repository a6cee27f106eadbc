"""A pytest plugin (``PYTEST_PLUGINS=hold_step``, this folder on ``PYTHONPATH``) that holds every
case of the benchmark session whose ``GPU_CHECK_STEP`` marker ends with ``HOLD_STEP``'s value
until a signal stops it: a step that outlasts any box, however fast the machine."""

from __future__ import annotations

import os
import time

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    held = os.environ.get("HOLD_STEP")
    if held and os.environ.get("GPU_CHECK_STEP", "").endswith(f":{held}"):
        while True:  # SIGINT (KeyboardInterrupt) or SIGKILL ends it
            time.sleep(3600)
