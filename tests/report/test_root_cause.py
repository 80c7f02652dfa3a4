"""root_cause on hand-made run directories and logs: fast, no torch, every input known."""
from __future__ import annotations

import json
import os
from pathlib import Path

from trainwreck.report import build_report, render_report
from trainwreck.report.crash_cause import TAIL_BYTES, last_exception, root_cause
from tests.report.rundirs import RunWriter, hung_run, killed_run

NUMPY = "RuntimeError: Numpy is not available"
TRACEBACK = ("Traceback (most recent call last):\n"
             '  File "/work/harness/rank.py", line 114, in run\n'
             "    resolve(entry)(ctx, cfg, hooks)\n"
             '  File "/torch/distributed/distributed_c10d.py", line 3000, in broadcast_object_list\n'
             "    tensor = torch.from_numpy(buf)\n"
             "             ^^^^^^^^^^^^^^^^^^^^^\n"
             f"{NUMPY}\n")


def crashed_run(root: Path, codes: dict[int, int], logs: dict[int, str | bytes], faults: list | None = None) -> Path:
    """One attempt of 2 ranks that stops after update 2 with these exit codes and rank logs."""
    w = RunWriter(root, faults=faults)
    w.attempt(0, 2)
    w.train(0, 2, 1, 2)
    w.exits(0, codes)
    w.end(status="failed", final_step=2)
    w.write()
    (root / "logs").mkdir(exist_ok=True)
    for rank, text in logs.items():
        path = root / "logs" / f"a000-r{rank:03d}.log"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def test_a_traceback_gives_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("starting\n" + TRACEBACK)
    assert last_exception(log)[0] == NUMPY


def test_a_chained_exception_gives_the_last_traceback_s_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n"
                   + TRACEBACK.replace(NUMPY, "ValueError: second"))
    assert last_exception(log)[0] == "ValueError: second"


def test_a_torn_traceback_says_it_was_cut_off(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(TRACEBACK.split("    tensor")[0])
    assert last_exception(log)[0] == "a traceback cut off before its exception line"


def test_a_log_without_a_traceback_or_missing_gives_nothing(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("step 1\nstep 2\n")
    assert last_exception(log) == (None, None)
    assert last_exception(tmp_path / "missing.log") == (None, None)


def test_binary_junk_around_a_traceback_is_tolerated(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(bytes(range(256)) * 10 + TRACEBACK.encode().replace(b"Numpy", b"Num\x00\xffpy"))
    line = last_exception(log)[0]
    assert line is not None and line.startswith("RuntimeError: Num") and line.endswith("is not available")
    log.write_bytes(bytes(range(256)) * 10)
    assert last_exception(log) == (None, None)


def test_a_huge_log_is_read_from_its_end_only(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"x" * (4 * TAIL_BYTES) + b"\n" + TRACEBACK.encode())
    assert last_exception(log)[0] == NUMPY


def test_a_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    outside.write_text(TRACEBACK)
    link = tmp_path / "a.log"
    link.symlink_to(outside)
    assert last_exception(link) == (None, None)


def test_the_first_rank_with_an_exception_is_named_with_its_line_and_log(tmp_path: Path) -> None:
    run = crashed_run(tmp_path / "run", {1: 1, 0: -9}, {1: TRACEBACK, 0: "step 1\n"})
    cause = root_cause(run)
    assert cause is not None and (cause.first.rank, cause.first.line, cause.first.log) == (1, NUMPY, "logs/a000-r001.log")
    assert [c.rank for c in cause.crashes] == [1], "rank 0 killed after rank 1 died is collateral, not a crash"
    assert not cause.before_faults and "rank 1 crashed" in cause.sentence()
    report = build_report(run)
    assert report["root_cause"]["line"] == NUMPY and report["headline"].startswith("Rank 1 crashed")


def test_a_rank_that_exits_non_zero_without_a_traceback_is_still_named(tmp_path: Path) -> None:
    cause = root_cause(crashed_run(tmp_path / "run", {0: 3, 1: 0}, {0: "bye\n"}))
    assert cause is not None and (cause.first.rank, cause.first.how, cause.first.code) == (0, "exit", 3)
    assert cause.first.line == "exited with code 3 and no traceback in its log"


def test_an_unplanned_signal_is_named_and_a_missing_log_tolerated(tmp_path: Path) -> None:
    cause = root_cause(crashed_run(tmp_path / "run", {0: -11, 1: 0}, {}))
    assert cause is not None and cause.first.line == "killed by SIGSEGV" and cause.first.log is None


def test_planned_kills_and_hangs_name_no_root_cause(tmp_path: Path) -> None:
    run = killed_run(tmp_path / "killed")
    (run / "logs").mkdir()
    (run / "logs" / "a000-r000.log").write_text(TRACEBACK.replace(NUMPY, "RuntimeError: Connection closed by peer"))
    assert root_cause(run) is None, "a peer's error after a planned kill is that kill's consequence"
    assert root_cause(hung_run(tmp_path / "hung")) is None
    assert root_cause(crashed_run(tmp_path / "clean", {0: 0, 1: 0}, {})) is None


def test_every_rank_crashing_before_the_plan_fired_is_said_in_words(tmp_path: Path) -> None:
    plan = [{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6}]
    run = crashed_run(tmp_path / "run", {0: 1, 1: 1}, {0: TRACEBACK, 1: TRACEBACK}, faults=plan)
    cause = root_cause(run)
    assert cause is not None and cause.before_faults and cause.first.rank == 0
    html = render_report(run)
    expected = (f"every rank crashed before any planned fault fired: {NUMPY} (rank 0 of attempt 0, "
                "logs/a000-r000.log); the verdicts below judge a run that never tested anything")
    assert expected in (run / "report" / "report.md").read_text()
    assert expected in html.read_text()
    assert json.loads((run / "report" / "report.json").read_text())["root_cause"]["sentence"] == expected


def test_a_traceback_prefixed_by_torch_s_rank_excepthook_gives_its_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("".join(f"[rank1]: {line}\n" for line in TRACEBACK.splitlines()))
    assert last_exception(log)[0] == NUMPY


def test_under_torchrun_the_agent_s_root_cause_names_the_rank_and_its_own_traceback(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    w.spec["launcher"] = "torchrun"
    w.attempt(0, 2)
    w.train(0, 2, 1, 2)
    w.harness("exit", attempt=0, rank=0, code=None)
    w.harness("exit", attempt=0, rank=1, code=None)
    run = w.write()
    (run / "logs").mkdir()
    rank1 = "".join(f"[rank1]: {line}\n" for line in TRACEBACK.splitlines())
    rank0 = "".join(f"[rank0]: {line}\n" for line in TRACEBACK.replace(NUMPY, "RuntimeError: peer gone").splitlines())
    agent = ("Traceback (most recent call last):\n  File \"torchrun\", line 1, in <module>\n"
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n=====\n"
             "Root Cause (first observed failure):\n[0]:\n  time      : now\n  host      : localhost\n"
             "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 7)\n")
    (run / "logs" / "torchrun.log").write_text(rank1 + rank0 + agent)
    cause = root_cause(run)
    assert cause is not None and (cause.first.rank, cause.first.line, cause.first.log) == \
        (1, NUMPY, "logs/torchrun.log")
    (run / "logs" / "torchrun.log").write_text(rank1 + rank0)  # the agent never gave up: nothing to name
    assert root_cause(run) is None


def test_a_peer_failing_after_the_first_crash_does_not_make_it_every_rank(tmp_path: Path) -> None:
    plan = [{"id": "k1", "kind": "signal", "rank": 1, "signal": "SIGKILL", "step": 6}]
    peer = TRACEBACK.replace(NUMPY, "RuntimeError: Connection closed by peer")
    run = crashed_run(tmp_path / "run", {1: 1, 0: 1}, {1: TRACEBACK, 0: peer}, faults=plan)
    os.utime(run / "logs" / "a000-r001.log", (1000.0, 1000.0))  # rank 1's traceback came first
    cause = root_cause(run)
    assert cause is not None and cause.before_faults and not cause.every_rank
    assert cause.sentence().startswith(f"rank 1 crashed before any planned fault fired: {NUMPY}")


GLOO_PEER = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242"


def test_an_unplanned_sigkill_is_the_root_cause_even_when_the_peer_s_error_is_stamped_first(tmp_path: Path) -> None:
    """The out-of-memory killer's SIGKILL of rank 1: rank 0's gloo error follows it, but the harness
    polls, so rank 0's traceback can be written before rank 1's exit is seen. The harness marks
    which exits it caused; a SIGKILL it did not cause is the first death, whatever the clocks say."""
    w = RunWriter(tmp_path / "run")
    w.attempt(0, 2)
    w.train(0, 2, 1, 2)
    w.t += 0.5
    w.harness("exit", attempt=0, rank=1, code=-9, stopped_by_harness=False)
    w.harness("exit", attempt=0, rank=0, code=1, stopped_by_harness=False)
    w.end(status="failed", final_step=2)
    run = w.write()
    (run / "logs").mkdir()
    peer = run / "logs" / "a000-r000.log"
    peer.write_text(TRACEBACK.replace(NUMPY, GLOO_PEER))
    os.utime(peer, (w.t - 0.2, w.t - 0.2))  # written 0.2 s before rank 1's exit was seen
    cause = root_cause(run)
    assert cause is not None and (cause.first.rank, cause.first.line) == (1, "killed by SIGKILL")
    assert [c.rank for c in cause.crashes] == [1], "rank 0's lost connection is the kill's consequence"
    sentence = cause.sentence()
    assert sentence.startswith("rank 1 was killed by SIGKILL, a signal no planned fault sent"), sentence
    assert "out-of-memory killer" in sentence and "Connection closed" not in sentence


def test_ranks_the_harness_stopped_are_no_crash_and_a_sigsegv_names_no_memory_killer(tmp_path: Path) -> None:
    def ended(name: str, *exits: tuple[int, bool]) -> Path:
        """Two ranks after update 2, rank r exiting with exits[r] = (code, stopped_by_harness)."""
        w = RunWriter(tmp_path / name)
        w.attempt(0, 2)
        w.train(0, 2, 1, 2)
        for rank, (code, stopped) in enumerate(exits):
            w.harness("exit", attempt=0, rank=rank, code=code, stopped_by_harness=stopped)
        w.end(status="failed", final_step=2)
        return w.write()

    cause = root_cause(ended("run", (-11, False), (-9, True)))
    assert cause is not None and [c.rank for c in cause.crashes] == [0]
    assert "SIGSEGV" in cause.sentence() and "out-of-memory" not in cause.sentence()
    assert root_cause(ended("stopped", (-9, True), (-9, True))) is None, \
        "every rank the harness killed (an interrupt, a hang): no crash"


def test_when_every_rank_dies_of_the_same_error_rank_0_is_named_whichever_wrote_first(tmp_path: Path) -> None:
    run = crashed_run(tmp_path / "run", {0: 1, 1: 1}, {0: TRACEBACK, 1: TRACEBACK})
    os.utime(run / "logs" / "a000-r000.log", (900.0, 900.0))  # both before their exit events (t = 1000 s)
    os.utime(run / "logs" / "a000-r001.log", (800.0, 800.0))  # and rank 1's traceback first
    cause = root_cause(run)
    assert cause is not None and cause.every_rank
    assert (cause.first.rank, cause.first.log) == (0, "logs/a000-r000.log")
