"""A server main for ForkedServer's tests: it reports, in its ready message, what it inherited from
the process that forked it (its parent, signal handlers and mask, environment), then waits for EOF."""
from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[0]))
    conn.send({"op": "ready", "pid": os.getpid(), "import_s": 0.0, "parent": os.getppid(),
               "named_parent": int(argv[1]), "session_leader": os.getsid(0) == os.getpid(),
               "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
               "sigint_python": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
               "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
               "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"), "marker": os.environ.get("FORKED_PROBE")})
    try:
        conn.recv()
    except EOFError:
        pass
