"""The one error a fault plan raises, whichever part of faults/ checks it."""
from __future__ import annotations

from trainwreck.rundir.errors import InputError


class PlanError(InputError):
    """A plan is unusable; the message names the fault id, the field, the bad value and the fix."""
