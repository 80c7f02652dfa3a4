"""The harness asks a Ray Train driver to remove a simulated node: one request, one answer, over FIFOs.

    serve_node_control(run_dir, remove)      # in the driver: a thread answering requests
    answer = request_node_removal(run_dir)   # in the harness: {"node_id", "pids", ...} or {"error"}

A `ray.cluster_utils.Cluster` lives in the driver process (its nodes are the driver's child
processes), so only the driver can call `cluster.remove_node`. The harness writes one JSON line
into the driver's FIFO (RUN/ray_node_control) naming a reply FIFO it already holds open for
reading; the driver removes the node and writes its answer there. A FIFO, not a file polled
for, because both sides block on the other's act (the reply is read with a timeout), and not a
socket, so nothing listens (a unix socket's path could also outgrow the 107 bytes a socket name
may have under a deep run directory). Stdlib only: the harness and the driver both import it.
"""
from __future__ import annotations

import json
import os
import select
import threading
import time
from pathlib import Path
from typing import Any, Callable

CONTROL = "ray_node_control"
"""The driver's request FIFO, in the run directory."""
REPLY = "ray_node_control.reply"


def serve_node_control(run_dir: Path, remove: Callable[[], dict[str, Any]],
                       then: Callable[[], None] = lambda: None) -> Path:
    """Create RUN/ray_node_control and answer every request on it with `remove()` (the node's
    facts, or {"error": why}) from a daemon thread, then call `then()` (after the answer: the
    harness holds the job still until it has it); returns the FIFO's path (unlink it at the end)."""
    path = Path(run_dir) / CONTROL
    if path.exists():
        path.unlink()  # a previous driver's (a rerun into the same directory)
    os.mkfifo(path)
    # Read and write: never at end of file between requests, and open before this returns, so a
    # request's non-blocking open for writing finds a reader from now on.
    requests = os.fdopen(os.open(path, os.O_RDWR), "r")

    def serve() -> None:
        with requests:
            for line in requests:
                request = json.loads(line)
                try:
                    answer = remove()
                except Exception as exc:  # the harness records why the fault did not act
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                with open(request["reply"], "w") as reply:
                    reply.write(json.dumps(answer))
                if "error" not in answer:
                    then()

    threading.Thread(target=serve, name="trainwreck-node-control", daemon=True).start()
    return path


def request_node_removal(run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Ask the driver serving RUN/ray_node_control to remove its simulated worker node; its answer,
    or {"error": why} when no driver serves the FIFO or none answered within `timeout_s`."""
    control, reply = Path(run_dir) / CONTROL, Path(run_dir) / REPLY
    if reply.exists():
        reply.unlink()
    os.mkfifo(reply)
    # Opened before the request goes: the driver's open for writing then never waits for a reader.
    fd = os.open(reply, os.O_RDONLY | os.O_NONBLOCK)
    try:
        try:
            out = os.open(control, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody reads it
        except OSError as exc:
            return {"error": f"the driver serves no node control at {control} ({exc.strerror})"}
        with os.fdopen(out, "w") as requests:
            requests.write(json.dumps({"remove": "worker", "reply": str(reply)}) + "\n")
        return _read_answer(fd, time.monotonic() + timeout_s, timeout_s)
    finally:
        os.close(fd)
        reply.unlink()


def _read_answer(fd: int, deadline: float, timeout_s: float) -> dict[str, Any]:
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        # Linux reports a FIFO readable only once a writer has come: data, or EOF after it closed.
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            answer = json.loads(data) if data else {"error": "the driver closed the reply without an answer"}
            return answer if isinstance(answer, dict) else {"error": f"the driver answered {answer!r}"}
        data += chunk
    return {"error": f"the driver did not answer within {timeout_s:.0f} s"}
