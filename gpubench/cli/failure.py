"""How a ``gpubench`` command ends when it does not succeed: one line on stderr naming what
failed and why, the traceback in a log file that line names, and a documented exit status
(``EXIT_CODES``; the table in docs/getting-started.md). Results already written stay as they
are: nothing here removes or rewrites a file."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_HUNG = 124  # gpubench.util.watchdog.EXIT_HUNG
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

EXIT_CODES = {
    0: "success: every selected case measured, the results written",
    EXIT_FAILED: "a case or the command failed (an error, out of memory, a case hung past "
                 "--timeout, a workload that exited the process) or wrote no result; the line "
                 "names the log with the traceback",
    EXIT_USAGE: "bad input (an option, a workload spec, a result file, an output path): "
                "nothing was run",
    EXIT_UNSUPPORTED: "gpubench case: the configuration cannot run on this machine",
    EXIT_HUNG: "a call hung past --timeout in code no exception reaches: the process was ended",
    EXIT_SIGINT: "interrupted by Ctrl-C (SIGINT); finished results kept",
    EXIT_SIGTERM: "stopped by SIGTERM; finished results kept",
}
"""Every status a ``gpubench`` command exits with, and what it means."""

LOG_DIR_ENV = "GPUBENCH_LOG_DIR"


def log_dir() -> Path:
    """Where failed commands' tracebacks go: ``$GPUBENCH_LOG_DIR``, else
    ``~/.cache/gpubench/logs``."""
    env = os.environ.get(LOG_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "gpubench" / "logs"


def write_log(command: str, err: BaseException) -> Path | None:
    """The traceback of ``err`` in a new file of ``log_dir()`` (else of the temporary folder);
    None where neither can be written."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = "".join(traceback.format_exception(err))
    for folder in (log_dir(), Path(tempfile.gettempdir()) / "gpubench-logs"):
        path = folder / f"{command}-{stamp}-{os.getpid()}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(f"gpubench {command} ({' '.join(sys.argv)})\n\n{text}")
            return path
        except OSError:
            continue
    return None


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says the process ran out of memory (host or device)."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(
        words in text for words in ("out of memory", "can't allocate memory",
                                    "cannot allocate memory", "std::bad_alloc"))


def reason(err: BaseException) -> str:
    """``err`` on one line: its type and the meaningful line of its message."""
    from gpubench.measure.journal import one_line

    text = one_line(str(err))
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def command_failed(command: str, subject: str | None, err: BaseException) -> int:
    """Say on one line that ``command`` (about ``subject``, a case or a model) failed with
    ``err``, where its traceback is, and return the exit status."""
    from gpubench.util.signals import exception_chain, interruption
    from gpubench.util.watchdog import is_time_limit

    who = f"gpubench {command}: " + (f"{subject}: " if subject else "")
    sig = interruption(err)
    if sig is not None:
        print(f"{who}interrupted ({sig.args[0]}); nothing more was written", file=sys.stderr)
        return sig.exit_code
    if any(isinstance(e, KeyboardInterrupt) for e in exception_chain(err)):
        return interrupted(command, subject)  # a Ctrl-C that another error wraps
    if is_time_limit(err) or isinstance(err, TimeoutError):
        print(f"{who}{' '.join(str(err).split())} (--timeout)", file=sys.stderr)
        return EXIT_FAILED
    log = write_log(command, err)
    where = f"; traceback in {log}" if log else ""
    if isinstance(err, SystemExit):
        print(f"{who}failed: something it ran called sys.exit({err.code!r}) (a workload or "
              f"plugin must return, not exit the process){where}", file=sys.stderr)
        return err.code if isinstance(err.code, int) and err.code > 0 else EXIT_FAILED
    what = "ran out of memory" if is_out_of_memory(err) else "failed"
    print(f"{who}{what}: {reason(err)}{where}", file=sys.stderr)
    return EXIT_FAILED


def interrupted(command: str, subject: str | None) -> int:
    """The one line of a Ctrl-C that reached the command's top; exit status 130."""
    who = f"gpubench {command}: " + (f"{subject}: " if subject else "")
    print(f"{who}interrupted (SIGINT); results already written are kept, nothing more was "
          "written", file=sys.stderr)
    return EXIT_SIGINT


@contextlib.contextmanager
def finished_kept(command: str, write: Callable[[BaseException], list[Path]]) -> Iterator[None]:
    """Keep what finished when Ctrl-C (or SIGTERM: ``gpubench.util.signals.Interrupted``)
    stops the work inside: ``write(err)`` writes the finished part (atomically) and returns the
    paths written (none where nothing finished); they are named on stdout, and the interruption
    goes on to the command's one line and exit status."""
    from gpubench.util.signals import Interrupted

    try:
        yield
    except (KeyboardInterrupt, Interrupted) as err:
        written = write(err)
        if written:
            print(f"gpubench {command}: interrupted; what finished is in "
                  + ", ".join(str(p) for p in written), flush=True)
        raise
