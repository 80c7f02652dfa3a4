"""The fork server's warm-up (harness/launch/rank.py `warm_kernels`): what it leaves in the process
every rank is forked from."""
from __future__ import annotations

import random

import pytest
import torch

from trainwreck.harness.launch.procs import thread_count
from trainwreck.harness.launch.rank import accelerator_built, warm_kernels
from trainwreck.trainer import state


def test_warming_the_servers_kernels_starts_no_thread_and_leaves_the_rng_streams_and_thread_count() -> None:
    # A thread in the server would be copied into every rank with whatever lock it held; the streams
    # and the thread count are the ranks' to set.
    torch.set_num_threads(2)
    try:
        before = (thread_count(), torch.get_num_threads(), random.getstate(), torch.get_rng_state())
        warm_kernels()
        after = (thread_count(), torch.get_num_threads(), random.getstate(), torch.get_rng_state())
    finally:
        torch.set_num_threads(1)
    assert after[:3] == before[:3]
    assert torch.equal(after[3], before[3])


def test_the_server_runs_no_backward_before_it_forks() -> None:
    # On a GPU host autograd's first backward starts a thread per device, and a child forked after
    # it cannot backpropagate ("Unable to handle autograd's threading in combination with fork").
    seen: list[object] = []
    real = torch.autograd.backward
    torch.autograd.backward = lambda *a, **k: seen.append(a)  # type: ignore[assignment]
    try:
        warm_kernels()
    finally:
        torch.autograd.backward = real
    assert seen == []


def test_with_an_accelerator_built_in_the_server_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The optimizer's step asks for the accelerator's current stream: on a GPU host that starts CUDA
    # in the server, and no rank forked from it could use CUDA again.
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(state, "fresh_state", lambda *a, **k: pytest.fail("the warm-up built a state"))
    assert accelerator_built()
    warm_kernels()


@pytest.mark.skipif(bool(torch.version.cuda or torch.version.hip), reason="an accelerator build: no warm-up there")
def test_the_cpu_build_is_one_the_server_warms() -> None:
    # CI installs the CPU wheel (torch==2.13.0): the warm-up must not silently never run there.
    assert not accelerator_built()
