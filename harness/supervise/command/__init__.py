"""The user's own command as a job target (`trainwreck run --cmd`): one home for all of it.

    target.py      Command: what it runs per rank, its plan check, its golden run, its judge
    golden_key.py  the key a command's golden run is cached under (the files it runs, versions)
    repeat.py      is the command deterministic? (its first steps run twice, compared)
    facts.py       the facts a judge adds: a global batch that changed, a rank's last error

Its in-rank faults are faults/foreign.py (built by the probe inside each rank); corrupting
its newest checkpoint between attempts is faults/between_attempts.py (applied by the launcher).
"""
from trainwreck.harness.supervise.command.target import Command

__all__ = ["Command"]
