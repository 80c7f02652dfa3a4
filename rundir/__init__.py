"""The run directory (format `trainwreck-run/1`), the one thing every layer shares: its paths,
run.json, the event log writer and the one forgiving reader (layout.py, events.py), the bounded,
link-refusing file layer under them (files.py), the root of every input error (errors.py), and how
the command lines take input: one-line usage errors, strict JSON from a flag or @FILE, and how they
end, without a last collection of torch's objects (arguments.py).

Standard library only and importing nothing else of ours, so the trainer, the faults, the
checkers, the report and the harness all stand on it (tests/test_architecture.py)."""
