"""Monitoring baselines of a run (forward progress, checkpoint age, restarts), exported as OpenMetrics.

The three numbers an operator pages on (docs/REPORTS.md, "Metrics"): samples trained per second, the
age of the newest committed checkpoint, and how many times the job restarted. `baselines` computes
them from the report (report.json `metrics`, so the handbook can quote them); `openmetrics` renders
them with prometheus_client, the ecosystem's client library (the optional extra `metrics`), in the
text format Prometheus and OpenMetrics scrapers read. Progress is labelled with the attempt and its
world size: a samples/s baseline learned on one world size is wrong on another.
"""
from __future__ import annotations

from typing import Any

from trainwreck.rundir.errors import InputError

METRICS_FILE = "metrics.prom"
"""Written beside report.json by `trainwreck report RUN_DIR --metrics`."""
PREFIX = "trainwreck_"


def _attempt(att: dict[str, Any], batch: int | None) -> dict[str, Any]:
    lanes = [lane for lane in att.get("lanes", []) if lane.get("first_s") is not None and lane.get("last_s") is not None]
    lane = min(lanes, key=lambda x: x["rank"]) if lanes else None
    updates = sum(hi - lo + 1 for lo, hi in lane["ranges"]) if lane else 0
    span = (lane["last_s"] - lane["first_s"]) if lane else 0.0
    rate = (updates - 1) * batch / span if batch and updates > 1 and span > 0 else None
    world = att.get("world_size")
    return {"attempt": att["attempt"], "world_size": world, "updates": updates,
            "step_s": round(span / (updates - 1), 6) if updates > 1 else None,
            "samples_per_s": round(rate, 3) if rate is not None else None,
            "samples_per_s_per_rank": round(rate / world, 3) if rate is not None and world else None}


def baselines(report: dict[str, Any]) -> dict[str, Any]:
    """report.json `metrics`: progress per attempt (samples/s from rank 0's first to last update of the
    attempt, `global_batch` samples an update), the checkpoint age at the run's end and its peak, and
    the restart count. The age counts from when the newest committed save began, not from its commit:
    a failure loses the work since the state it holds was taken, and an asynchronous save commits a
    persist's length after that."""
    saves = sorted((s["t_s"], held_since(s)) for s in report.get("saves", []) if isinstance(s.get("t_s"), (int, float)))
    end = report.get("wall_s") or 0.0
    # Between two commits the age grows from (commit - held) to (next commit - held); before the first, from 0.
    held = [0.0, *(h for _, h in saves)]
    until = [t for t, _ in saves] + [end]
    ages = [b - a for a, b in zip(held, until)]
    return {"restarts": max(len(report.get("attempts", [])) - 1, 0),
            "last_step": (report.get("totals") or {}).get("final_step"),
            "checkpoint_age_end_s": round(end - held[-1], 3),
            "checkpoint_age_max_s": round(max(ages), 3) if ages else None,
            "attempts": [_attempt(a, report.get("spec", {}).get("global_batch")) for a in report.get("attempts", [])]}


def held_since(save: dict[str, Any]) -> float:
    """When the state a committed save holds was taken: its commit time less the save's own `seconds`
    (the whole write for a synchronous save, the background persist for an asynchronous one)."""
    took = save.get("seconds")
    return save["t_s"] - took if isinstance(took, (int, float)) and 0 <= took <= save["t_s"] else save["t_s"]


def openmetrics(report: dict[str, Any]) -> bytes:
    """The run's metrics as OpenMetrics text (prometheus_client's exposition, ending in `# EOF`)."""
    try:
        from prometheus_client import CollectorRegistry, Counter, Gauge
        from prometheus_client.openmetrics.exposition import generate_latest
    except ImportError:
        raise InputError("--metrics needs prometheus_client: pip install 'trainwreck[metrics]'") from None
    metrics, run = report["metrics"], report.get("name", "")
    registry = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(PREFIX + name, doc, ("run", *labels), registry=registry)

    restarts = Counter(PREFIX + "restarts", "restarts of the job (attempts after the first)", ("run",),
                       registry=registry)
    restarts.labels(run).inc(metrics["restarts"])
    for name, doc in (("checkpoint_age_end_seconds", "seconds since the newest committed checkpoint, at the run's end"),
                      ("checkpoint_age_max_seconds", "the longest the job went without a newer committed checkpoint"),
                      ("last_step", "the newest update the job applied")):
        value = metrics[{"checkpoint_age_end_seconds": "checkpoint_age_end_s",
                         "checkpoint_age_max_seconds": "checkpoint_age_max_s", "last_step": "last_step"}[name]]
        if value is not None:
            gauge(name, doc).labels(run).set(value)
    per_attempt = {"samples_per_second": ("samples_per_s", "forward progress: samples trained per second"),
                   "rank_samples_per_second": ("samples_per_s_per_rank", "samples trained per second per rank"),
                   "step_seconds": ("step_s", "mean seconds per update")}
    for name, (field, doc) in per_attempt.items():
        g = gauge(name, doc, ("attempt", "world_size"))
        for att in metrics["attempts"]:
            if att[field] is not None:
                g.labels(run, str(att["attempt"]), str(att["world_size"])).set(att[field])
    return generate_latest(registry)
