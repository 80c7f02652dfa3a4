"""The run directory (format `trainwreck-run/1`), the one thing every layer shares: its paths,
run.json, the event log writer and the one forgiving reader (layout.py, events.py), the bounded,
link-refusing file layer under them (files.py) and the root of every input error (errors.py).

Standard library only and importing nothing else of ours, so the trainer, the faults, the
checkers, the report and the harness all stand on it (tests/test_architecture.py)."""
