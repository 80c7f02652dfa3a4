"""Records the two faulthandler dumps `current-first.txt` and `current-second.txt`:

    python tests/report/data/stacks/record.py main current-second.txt
    python tests/report/data/stacks/record.py worker current-first.txt

The main thread trains, a worker waits (as an async checkpoint's does), and SIGUSR1 is handled by
the thread named: by the main thread the "Current thread" block comes second, by the worker
first. The watchdog's SIGUSR1 goes to the process, and the kernel picks the thread.
"""
import faulthandler
import signal
import sys
import threading
import time
from pathlib import Path


def persist(ready: threading.Event, stop: threading.Event) -> None:
    ready.set()
    stop.wait()


def train_step(handler: threading.Thread, out: str) -> None:
    signal.pthread_kill(handler.ident, signal.SIGUSR1)
    while "in <module>" not in Path(out).read_text():  # the main thread's block, the dump's last, is written
        time.sleep(0.001)


ready, stop = threading.Event(), threading.Event()
worker = threading.Thread(target=persist, args=(ready, stop), name="ckpt-persist", daemon=True)
worker.start()
ready.wait()
with open(sys.argv[2], "w") as out:
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    train_step(threading.main_thread() if sys.argv[1] == "main" else worker, sys.argv[2])
stop.set()
