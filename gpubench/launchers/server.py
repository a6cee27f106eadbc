"""The fork server's first import (``workers.SERVER_PRELOAD``): SIGINT ignored in the server,
and so in every process forked from it from its first instruction on (the server gives each the
SIGINT handler it had before serving). A terminal's Ctrl-C reaches the whole process group: the
run answers it and stops its ranks; the server, a rank still starting or one between the fork
and ``guarded_call`` would otherwise die of it with a traceback.

Then the modules a run's workloads declare for their forked ranks (``workers.SERVER_IMPORTS_ENV``,
``Workload.imports``), each skipped where its import fails in any way: the ranks then import
what they need themselves, where the server's own preload would have stopped at an error other
than ImportError (a library built for another torch) and left the run to spawn its ranks."""

import importlib
import os
import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)

# workers.SERVER_IMPORTS_ENV, popped: the processes forked from here do not inherit it
for _name in filter(None, os.environ.pop("GPUBENCH_SERVER_IMPORTS", "").split(",")):
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - the rank imports it, and meets its error there
        pass
