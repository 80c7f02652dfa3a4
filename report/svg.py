"""Inline SVG pictures of a report: the step timeline, the wall clock, the phase breakdown.

Plain SVG strings (no library, no script): every mark carries a <title>, which
browsers show as a tooltip without JavaScript. The timeline's x axis is the
update number, not time: steps take milliseconds and a hang takes seconds, so on
a time axis the work would be invisible; the wall-clock picture shows the time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Any

WIDTH = 960
LEFT = 150  # lane labels
RIGHT = 110  # exit codes
PLOT = WIDTH - LEFT - RIGHT
LANE_H, LANE_GAP, HEADER_H, ATTEMPT_GAP, AXIS_H, FOOTER_H = 16, 4, 20, 10, 26, 14
MAX_LANES = 8
"""More ranks than this in an attempt are drawn aggregated: one lane per group of ranks that did the same."""

COLORS = {"lineage": "#2563eb", "redo": "#f59e0b", "save": "#16a34a", "missed": "#dc2626",
          "fault": "#ef4444", "hang": "#d97706", "restore": "#7c3aed", "lane": "#eef2f7",
          "grid": "#d5dbe3", "text": "#1f2937", "muted": "#6b7280", "startup": "#cbd5e1"}
PHASE_COLORS = {"data": "#94a3b8", "forward": "#60a5fa", "backward": "#1d4ed8", "sync": "#f59e0b",
                "optimizer": "#10b981", "checkpoint": "#a855f7"}
SIGNAL_NAMES = {-9: "SIGKILL", -15: "SIGTERM", -19: "SIGSTOP", -6: "SIGABRT", -11: "SIGSEGV"}

DEFS = (
    '<defs><pattern id="tw-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f59e0b"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#fff7ed" stroke-width="2.5"/></pattern>'
    '<pattern id="tw-fail" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    '<rect width="6" height="6" fill="#fecaca"/><line x1="0" y1="0" x2="0" y2="6" stroke="#ef4444" '
    'stroke-width="1.5"/></pattern></defs>'
)


@dataclass
class Lane:
    """A row of the timeline: one rank, or a group of ranks that did exactly the same."""

    label: str
    ranks: list[int]
    lineage: list[list[int]]
    redo: list[list[int]]
    exit: Any
    y: float = 0.0


@dataclass
class Block:
    """One attempt's rows."""

    attempt: dict[str, Any]
    lanes: list[Lane] = field(default_factory=list)
    y: float = 0.0  # the header row's top

    def lane_of(self, rank: int) -> Lane | None:
        return next((lane for lane in self.lanes if rank in lane.ranks), None)

    @property
    def bottom(self) -> float:
        return self.lanes[-1].y + LANE_H if self.lanes else self.y + HEADER_H


def _t(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, body: str, size: int = 11, anchor: str = "start", fill: str = COLORS["text"],
          weight: str = "normal", cls: str = "") -> str:
    extra = f' class="{cls}"' if cls else ""
    return (f'<text x="{_t(x)}" y="{_t(y)}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}"{extra}>{escape(body)}</text>')


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (f'<rect x="{_t(x)}" y="{_t(y)}" width="{_t(max(w, 0.8))}" height="{_t(h)}" fill="{fill}" {extra}>'
            f"{tip}</rect>")


def _diamond(cx: float, cy: float, r: float, fill: str, stroke: str, title: str, cls: str) -> str:
    pts = f"{_t(cx)},{_t(cy - r)} {_t(cx + r)},{_t(cy)} {_t(cx)},{_t(cy + r)} {_t(cx - r)},{_t(cy)}"
    return (f'<polygon class="{cls}" points="{pts}" fill="{fill}" stroke="{stroke}" stroke-width="1.5">'
            f"<title>{escape(title)}</title></polygon>")


def nice_step(span: float, target: int = 12) -> float:
    """A round tick spacing (1, 2, 5 x 10^n) giving about `target` ticks over `span`."""
    raw = max(span / target, 1e-9)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(magnitude * m for m in (1, 2, 5, 10) if magnitude * m >= raw)


# ----- the step timeline ----------------------------------------------------------------


def group_lanes(attempt: dict[str, Any]) -> list[Lane]:
    """One lane per rank up to MAX_LANES ranks; beyond, ranks that did the same share a lane."""
    lanes = [Lane(f"r{ln['rank']}", [ln["rank"]], ln["lineage"], ln["redo"], ln.get("exit"))
             for ln in attempt["lanes"]]
    if len(lanes) <= MAX_LANES:
        return lanes
    groups: dict[str, Lane] = {}
    for lane in lanes:
        key = repr((lane.lineage, lane.redo, lane.exit))
        if key in groups:
            groups[key].ranks += lane.ranks
        else:
            groups[key] = Lane("", list(lane.ranks), lane.lineage, lane.redo, lane.exit)
    merged = list(groups.values())
    if len(merged) > MAX_LANES:  # too varied to list: one lane, the union of the work
        every = sorted(r for lane in merged for r in lane.ranks)
        union = sorted({tuple(x) for lane in merged for x in lane.lineage})
        redo = sorted({tuple(x) for lane in merged for x in lane.redo})
        merged = [Lane("", every, [list(x) for x in union], [list(x) for x in redo], "mixed")]
    for lane in merged:
        lane.label = "r" + _rank_list(lane.ranks)
    return merged


def _rank_list(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def timeline_svg(report: dict[str, Any]) -> str:
    """Lanes per rank per attempt over update numbers: lineage vs redo, saves, faults, hangs, restarts."""
    attempts = report["attempts"]
    max_step = max([report["spec"].get("total_steps") or 0] +
                   [hi for a in attempts for ln in a["lanes"] for _, hi in ln["ranges"]] + [1])
    px = PLOT / max_step
    blocks, y = [], AXIS_H
    for att in attempts:
        block = Block(att, group_lanes(att), y)
        for i, lane in enumerate(block.lanes):
            lane.y = y + HEADER_H + i * (LANE_H + LANE_GAP)
        blocks.append(block)
        # Fault and hang labels go in a row under the lanes, clear of the attempt's own note.
        y = block.bottom + ATTEMPT_GAP + (FOOTER_H if _has_marks(att, report) else 0)
    height = y + 34
    x = lambda step: LEFT + step * px  # noqa: E731 - the one scale of this picture
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tw-timeline" viewBox="0 0 {WIDTH} {_t(height)}" '
             f'width="{WIDTH}" height="{_t(height)}" role="img" font-family="system-ui, sans-serif">',
             f"<title>Timeline of {escape(report['name'])}: one lane per rank per attempt, by update number</title>",
             DEFS]
    parts += _step_axis(max_step, x, height)
    for block in blocks:
        parts += _block(block, report, x, px)
    parts += _timeline_legend(height - 14)
    parts.append("</svg>")
    return "\n".join(parts)


def _has_marks(att: dict[str, Any], report: dict[str, Any]) -> bool:
    return any(f["attempt"] == att["attempt"] and f["in_step"] is not None for f in report["faults"]) or \
        any(h["attempt"] == att["attempt"] for h in report["hangs"])


def _step_axis(max_step: int, x: Any, height: float) -> list[str]:
    tick = max(1, int(nice_step(max_step)))
    out = [_text(LEFT - 8, 16, "update →", 10, "end", COLORS["muted"])]
    for k in range(0, max_step + 1, tick):
        out.append(f'<line x1="{_t(x(k))}" y1="20" x2="{_t(x(k))}" y2="{_t(height - 30)}" '
                   f'stroke="{COLORS["grid"]}" stroke-width="1"/>')
        out.append(_text(x(k), 16, str(k), 10, "middle", COLORS["muted"]))
    return out


def _block(block: Block, report: dict[str, Any], x: Any, px: float) -> list[str]:
    att = block.attempt
    a = att["attempt"]
    out = [f'<g class="tw-attempt" data-attempt="{a}">', _text(4, block.y + 14, _attempt_label(att), 11,
                                                               weight="bold")]
    out.append(_text(LEFT, block.y + 14, _attempt_note(att, report), 10, fill=COLORS["muted"]))
    for lane in block.lanes:
        out += _lane(lane, a, x, px)
    out += _restore_mark(block, x)
    out += _saves(block, report, x)
    out += _faults(block, report, x)
    out += _hangs(block, report, x)
    out.append("</g>")
    return out


def _attempt_label(att: dict[str, Any]) -> str:
    world = att.get("world_size")
    return f"attempt {att['attempt']}" + (f" · {world} rank{'s' if world != 1 else ''}" if world else "")


def _attempt_note(att: dict[str, Any], report: dict[str, Any]) -> str:
    bits = []
    if att["restored"]:
        bits.append(f"↺ restored {att['restored']['checkpoint']} (step {att['restored']['step']})")
    elif att["lanes"]:
        bits.append("fresh start (step 0)")
    if att["rejected"]:
        bits.append(f"rejected {', '.join(att['rejected'][:3])}")
    for f in report["faults"]:
        if f["attempt"] == a_of(att) and not f["repeat"] and f["in_step"] is None:
            bits.append(f"⚡ {f['id']} ({f['kind']}{', ' + str(f['checkpoint']) if f['checkpoint'] else ''})")
    bits.append(f"ended: {att['ended']}")
    return " · ".join(bits)


def a_of(att: dict[str, Any]) -> int:
    return int(att["attempt"])


def _lane(lane: Lane, attempt: int, x: Any, px: float) -> list[str]:
    y = lane.y
    out = [f'<g class="tw-lane" data-attempt="{attempt}" data-ranks="{_rank_list(lane.ranks)}">',
           _rect(LEFT, y, PLOT, LANE_H, COLORS["lane"]),
           _text(LEFT - 8, y + 12, lane.label, 11, "end")]
    for lo, hi in lane.lineage:
        out.append(_rect(x(lo - 1), y + 2, (hi - lo + 1) * px, LANE_H - 4, COLORS["lineage"],
                         f"attempt {attempt} {lane.label}: updates {lo}-{hi} (lineage: shaped the final model)",
                         'class="tw-lineage"'))
    for lo, hi in lane.redo:
        out.append(_rect(x(lo - 1), y + 2, (hi - lo + 1) * px, LANE_H - 4, "url(#tw-hatch)",
                         f"attempt {attempt} {lane.label}: updates {lo}-{hi} redone later (outside the lineage)",
                         'class="tw-redo"'))
    if px >= 8:  # cell borders only where a step is wide enough to read as one
        cuts = " ".join(f"M{_t(x(k))} {_t(y + 2)}V{_t(y + LANE_H - 2)}"
                        for lo, hi in lane.lineage + lane.redo for k in range(lo, hi))
        if cuts:
            out.append(f'<path d="{cuts}" stroke="#ffffff" stroke-width="1" opacity="0.7"/>')
    out.append(_exit_text(lane.exit, y))
    out.append("</g>")
    return out


def _exit_text(code: Any, y: float) -> str:
    if code is None:
        return _text(LEFT + PLOT + 8, y + 12, "no exit seen", 10, fill=COLORS["muted"])
    if code == "mixed":
        return _text(LEFT + PLOT + 8, y + 12, "exits differ", 10, fill=COLORS["muted"])
    if code == 0:
        return _text(LEFT + PLOT + 8, y + 12, "✓ exit 0", 10, fill=COLORS["save"])
    name = SIGNAL_NAMES.get(code, "")
    return _text(LEFT + PLOT + 8, y + 12, f"✕ exit {code}{' ' + name if name else ''}", 10, fill=COLORS["missed"])


def _restore_mark(block: Block, x: Any) -> list[str]:
    restored = block.attempt["restored"]
    if not restored or not block.lanes or restored.get("step") is None:
        return []
    xs, top, bottom = x(restored["step"]), block.lanes[0].y - 2, block.bottom + 2
    return [f'<line class="tw-restore" x1="{_t(xs)}" y1="{_t(top)}" x2="{_t(xs)}" y2="{_t(bottom)}" '
            f'stroke="{COLORS["restore"]}" stroke-width="2" stroke-dasharray="3 2">'
            f"<title>restored {escape(str(restored['checkpoint']))}: resumes with update {restored['step'] + 1}"
            "</title></line>"]


def _saves(block: Block, report: dict[str, Any], x: Any) -> list[str]:
    a = a_of(block.attempt)
    out = []
    for save in report["saves"]:
        lane = block.lane_of(save.get("rank") or 0) if save["attempt"] == a else None
        if lane is None or save["step"] is None:
            continue
        took = f", took {save['seconds']:.3f} s" if isinstance(save.get("seconds"), (int, float)) else ""
        out.append(_diamond(x(save["step"]), lane.y + LANE_H / 2, 5, COLORS["save"], "#ffffff",
                            f"save {save['checkpoint']} committed at +{save['t_s']:.2f} s{took}", "tw-save"))
    lane0 = block.lane_of(0)
    for missed in report["missed_saves"]:
        if missed["attempt"] == a and lane0 is not None:
            out.append(_diamond(x(missed["step"]), lane0.y + LANE_H / 2, 5, "#ffffff", COLORS["missed"],
                                f"save after update {missed['step']} was due but never committed", "tw-missed"))
    return out


def _faults(block: Block, report: dict[str, Any], x: Any) -> list[str]:
    """A fault shades its attempt from the update it hit to the attempt's end: that work was doomed."""
    a, out = a_of(block.attempt), []
    end_step = max([block.attempt.get("last_step") or 0])
    for f in report["faults"]:
        if f["attempt"] != a or f["in_step"] is None or f["repeat"] or not block.lanes:
            continue
        x0 = x(f["in_step"] - 1)
        # A fault the attempt survived (a straggler, a stall) doomed nothing: mark where it began only.
        survived = block.attempt["ended"] == "completed"
        x1 = x0 + 4 if survived else max(x(max(end_step, f["in_step"])), x0 + 4)
        title = f"fault {f['id']} ({f['signal'] or f['kind']}) at +{f['t_s']:.2f} s during update {f['in_step']}: " \
                f"{f['detail'] or ''}"
        top, h = block.lanes[0].y - 3, block.bottom - block.lanes[0].y + 6
        out.append(_rect(x0, top, x1 - x0, h, COLORS["fault"], title, 'class="tw-fault" opacity="0.28"'))
        out.append(f'<line x1="{_t(x0)}" y1="{_t(top)}" x2="{_t(x0)}" y2="{_t(top + h)}" stroke="{COLORS["fault"]}" '
                   'stroke-width="2"/>')
        for rank in f["ranks"]:
            lane = block.lane_of(rank)
            if lane is not None:
                out.append(_text(x0 + 2, lane.y + 12.5, "✕", 13, fill=COLORS["fault"], weight="bold",
                                 cls="tw-fault-mark"))
        # Left of the fault line, under the lanes; hang labels go right of their step, so they never meet.
        label = f"⚡ {f['id']} ({f['signal'] or f['kind']}, +{f['t_s']:.2f} s)"
        fits_left = x0 - 3 - 6 * len(label) > 0  # near update 0 it would run off the picture
        out.append(_text(x0 - 3 if fits_left else x0 + 3, block.bottom + 12, label, 10,
                         "end" if fits_left else "start", COLORS["fault"], "bold"))
    return out


def _hangs(block: Block, report: dict[str, Any], x: Any) -> list[str]:
    a, out = a_of(block.attempt), []
    for hang in report["hangs"]:
        if hang["attempt"] != a or hang.get("last_step") is None:
            continue
        k = hang["last_step"]
        for rank in hang["ranks"]:
            lane = block.lane_of(rank)
            if lane is None:
                continue
            title = (f"hang declared at +{hang['t_s']:.2f} s after {hang['detected_after_s']} s without progress; "
                     f"suspect rank {rank} stuck in update {k}")
            out.append(_rect(x(k - 1), lane.y, max(x(k) - x(k - 1), 6), LANE_H, "none", title,
                             f'class="tw-hang" stroke="{COLORS["hang"]}" stroke-width="2.5"'))
        out.append(_text(x(k) + 4, block.bottom + 12, f"‖ hang detected after {hang['detected_after_s']} s",
                         10, fill=COLORS["hang"], weight="bold"))
    return out


def _timeline_legend(y: float) -> list[str]:
    items = [("lineage", COLORS["lineage"], "rect"), ("redo (outside the lineage)", "url(#tw-hatch)", "rect"),
             ("save committed", COLORS["save"], "diamond"), ("save due, not committed", "#ffffff", "diamond-o"),
             ("fault (shaded to the attempt's end)", COLORS["fault"], "fault"), ("hang suspect", "none", "hang"),
             ("restored from", COLORS["restore"], "line")]
    out, cx = ['<g class="tw-legend">'], float(LEFT)
    for label, fill, shape in items:
        if shape == "rect":
            out.append(_rect(cx, y - 9, 14, 10, fill))
        elif shape.startswith("diamond"):
            out.append(_diamond(cx + 6, y - 4, 5, fill, COLORS["missed"] if shape == "diamond-o" else "#fff",
                                label, "tw-legend-mark"))
        elif shape == "fault":
            out.append(_rect(cx, y - 9, 14, 10, fill, "", 'opacity="0.3"'))
        elif shape == "hang":
            out.append(_rect(cx, y - 9, 14, 10, "none", "", f'stroke="{COLORS["hang"]}" stroke-width="2"'))
        else:
            out.append(f'<line x1="{_t(cx + 7)}" y1="{_t(y - 10)}" x2="{_t(cx + 7)}" y2="{_t(y + 1)}" '
                       f'stroke="{fill}" stroke-width="2" stroke-dasharray="3 2"/>')
        out.append(_text(cx + 18, y, label, 10, fill=COLORS["muted"]))
        cx += 26 + 5.6 * len(label)
    out.append("</g>")
    return out


# ----- the wall clock -------------------------------------------------------------------


def wallclock_svg(report: dict[str, Any]) -> str:
    """One bar per attempt on a seconds axis: start-up, training, and the time a failure cost."""
    attempts = [a for a in report["attempts"] if a["start_s"] is not None]
    span = max([report.get("wall_s") or 0.0] + [a["end_s"] or 0.0 for a in attempts] + [1e-3])
    px = PLOT / span
    x = lambda s: LEFT + s * px  # noqa: E731
    row_h, top = 26, AXIS_H
    height = top + row_h * max(len(attempts), 1) + 30
    failed = {r["attempt"]: r for r in report["recovery"]}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tw-wallclock" viewBox="0 0 {WIDTH} {height}" '
             f'width="{WIDTH}" height="{height}" role="img" font-family="system-ui, sans-serif">',
             f"<title>Wall clock of {escape(report['name'])}: where the seconds went, per attempt</title>", DEFS]
    tick = nice_step(span, 10)
    k = 0.0
    while k <= span + 1e-9:
        parts.append(f'<line x1="{_t(x(k))}" y1="20" x2="{_t(x(k))}" y2="{height - 26}" stroke="{COLORS["grid"]}"/>')
        parts.append(_text(x(k), 16, f"{k:g} s", 10, "middle", COLORS["muted"]))
        k = round(k + tick, 9)
    for i, att in enumerate(attempts):
        parts += _clock_row(att, failed.get(att["attempt"]), report, top + i * row_h, x)
    legend = [("start-up", COLORS["startup"]), ("training", COLORS["lineage"]),
              ("after the failure, until the attempt was gone", "url(#tw-fail)")]
    cx = float(LEFT)
    for label, fill in legend:
        parts.append(_rect(cx, height - 19, 14, 10, fill))
        parts.append(_text(cx + 18, height - 10, label, 10, fill=COLORS["muted"]))
        cx += 30 + 5.6 * len(label)
    parts.append("</svg>")
    return "\n".join(parts)


def _clock_row(att: dict[str, Any], failure: dict[str, Any] | None, report: dict[str, Any], y: float,
               x: Any) -> list[str]:
    start, first, end = att["start_s"], att["first_step_s"], att["end_s"] or att["start_s"]
    stop = failure["failed_s"] if failure and failure["failed_s"] is not None else end
    out = [_text(4, y + 15, _attempt_label(att), 11, weight="bold")]
    if first is not None:
        out.append(_rect(x(start), y + 4, x(first) - x(start), 14, COLORS["startup"],
                         f"start-up: {first - start:.2f} s until the first update"))
        out.append(_rect(x(first), y + 4, x(max(stop, first)) - x(first), 14, COLORS["lineage"],
                         f"training: {max(stop, first) - first:.2f} s"))
    if failure and end > stop:
        out.append(_rect(x(stop), y + 4, x(end) - x(stop), 14, "url(#tw-fail)",
                         f"{end - stop:.2f} s from the failure until the attempt was gone ({failure['cause']})"))
    for f in report["faults"]:
        if f["attempt"] == att["attempt"] and not f["repeat"] and f["t_s"] is not None:
            out.append(f'<polygon points="{_t(x(f["t_s"]))},{_t(y + 3)} {_t(x(f["t_s"]) - 4)},{_t(y - 3)} '
                       f'{_t(x(f["t_s"]) + 4)},{_t(y - 3)}" fill="{COLORS["fault"]}"><title>fault {escape(f["id"])} '
                       f'at +{f["t_s"]:.2f} s</title></polygon>')
    for hang in report["hangs"]:
        if hang["attempt"] == att["attempt"] and hang["t_s"] is not None:
            out.append(f'<line x1="{_t(x(hang["t_s"]))}" y1="{_t(y + 1)}" x2="{_t(x(hang["t_s"]))}" '
                       f'y2="{_t(y + 21)}" stroke="{COLORS["hang"]}" stroke-width="3"><title>hang declared at '
                       f'+{hang["t_s"]:.2f} s</title></line>')
    took = f"{end - start:.2f} s" + (f", {att['ended']}" if att["ended"] else "")
    out.append(_text(LEFT + PLOT + 8, y + 15, took, 10, fill=COLORS["muted"]))
    return out


# ----- phases ---------------------------------------------------------------------------


def phases_svg(report: dict[str, Any]) -> str:
    """Stacked bars: seconds per phase per rank over the whole run; the slowest rank marked."""
    phases = report["phases"]
    rows, names = phases["ranks"], phases["phase_names"]
    if not rows:
        return ""
    biggest = max(sum(r["totals"].values()) for r in rows) or 1.0
    plot = PLOT - 130  # room right of the longest bar for its total and the slowest-rank mark
    bar_h, gap, top = 16, 6, 8
    shown = rows[:64]  # beyond that a table says more than bars
    height = top + len(shown) * (bar_h + gap) + 30
    px = plot / biggest
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tw-phases" viewBox="0 0 {WIDTH} {height}" '
             f'width="{WIDTH}" height="{height}" role="img" font-family="system-ui, sans-serif">',
             "<title>Seconds per step phase, per rank, over the whole run</title>"]
    for i, row in enumerate(shown):
        y = top + i * (bar_h + gap)
        slow = row["rank"] == phases["slowest_rank"]
        parts.append(_text(LEFT - 8, y + 12, f"rank {row['rank']}", 11, "end", weight="bold" if slow else "normal"))
        cx = float(LEFT)
        for name in names:
            seconds = row["totals"].get(name, 0.0)
            if seconds > 0:
                parts.append(_rect(cx, y, seconds * px, bar_h, PHASE_COLORS.get(name, "#9ca3af"),
                                   f"rank {row['rank']} {name}: {seconds:.3f} s over {row['steps']} steps"))
                cx += seconds * px
        label = f"{sum(row['totals'].values()):.2f} s" + (f"  ◀ slowest{_ratio(row, rows)}" if slow else "")
        parts.append(_text(cx + 6, y + 12, label, 10,
                           fill=COLORS["missed"] if slow else COLORS["muted"], weight="bold" if slow else "normal",
                           cls="tw-slowest" if slow else ""))
    cx = float(LEFT)
    for name in names:
        parts.append(_rect(cx, height - 19, 12, 10, PHASE_COLORS.get(name, "#9ca3af")))
        parts.append(_text(cx + 16, height - 10, name, 10, fill=COLORS["muted"]))
        cx += 28 + 6 * len(name)
    parts.append("</svg>")
    return "\n".join(parts)


def _ratio(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """How much more own work the slowest rank did than the others' median: 1.1x is noise, 3x a straggler."""
    others = sorted(r["own_s"] for r in rows if r is not row)
    median = others[len(others) // 2] if others else 0.0
    return f" ({row['own_s'] / median:.1f}× own work)" if median > 0 else ""
