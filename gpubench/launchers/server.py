"""The fork server's first import (``workers.SERVER_PRELOAD``): SIGINT ignored in the server,
and so in every process forked from it from its first instruction on (the server gives each the
SIGINT handler it had before serving). A terminal's Ctrl-C reaches the whole process group: the
run answers it and stops its ranks; the server, a rank still starting or one between the fork
and ``guarded_call`` would otherwise die of it with a traceback."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
