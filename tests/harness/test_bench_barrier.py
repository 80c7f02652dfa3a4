"""benchmarks/barrier.py: torch's monitored_barrier on gloo, run for real with one rank held back, names
that rank; the rank numbers are read from the error whatever torch's wording (the handbook's hang
chapter quotes them, tests/report/test_handbook.py)."""
from __future__ import annotations

import pytest

from trainwreck.benchmarks.barrier import main, measure, named_ranks

# What torch 2.13.0+cpu's monitored_barrier raised, world 3, rank 2 held back, wait_all_ranks=True.
RANK0 = "[Rank 0]: Ranks 2 failed to pass monitoredBarrier in 1000 ms"
RANK1 = ("Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. "
         "Please check rank 0 logs for faulty rank.\n Original exception: \n[/__w/pytorch/pytorch/third_party/gloo/"
         "gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:23730.")


def test_the_ranks_an_error_names_are_read_without_the_callers_own() -> None:
    assert named_ranks(RANK0, 0) == [2]
    assert named_ranks(RANK1, 1) == [0]  # it passed, and points at rank 0's log
    # torch's other wordings: one rank without wait_all_ranks, several with it
    assert named_ranks("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms", 0) == [1]
    assert named_ranks("[Rank 0]: Ranks 2, 3, 11 failed to pass monitoredBarrier in 1000 ms", 0) == [2, 3, 11]


def test_monitored_barrier_on_gloo_names_the_rank_held_back_and_only_rank_0_says_so() -> None:
    result = measure(world=3, timeout_s=1.0)
    assert result["backend"] == "gloo" and result["stalled_rank"] == 2
    first, second = result["ranks"]
    assert first["error"] is not None and first["names"] == [2], first  # the missing rank, by number
    assert first["raised_after_s"] >= 1.0  # it waited out its timeout
    assert second["error"] is not None and second["names"] == [0], second  # only where to look


@pytest.mark.parametrize("argv,field", [(["--world", "1"], "--world"), (["--timeout", "0"], "--timeout")])
def test_bad_input_is_refused_with_exit_2_and_a_line_naming_the_field(
        argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{field}: ") and "\n" not in err
