"""FSDP shards live on the device the run asked for, never on the host's accelerator.

fully_shard without a mesh builds one on `torch._C._get_accelerator()`: on a GPU host a
CPU (gloo) job's shards moved to CUDA, and every rank set the device LOCAL_RANK, so the
FSDP benchmark's two ranks crashed on a one-GPU machine. The trainer passes its own mesh;
this test makes the default mesh raise, which is what a CPU machine cannot show otherwise.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

CHILD = textwrap.dedent("""
    import importlib
    import sys
    import torch
    import torch.distributed as dist
    from trainwreck.trainer import parallel
    from trainwreck.trainer.config import TrainConfig

    def refuse(*args, **kwargs):
        raise AssertionError("fully_shard fell back to the host's default mesh")

    patched = []  # where fully_shard looks its default mesh up: torch >= 2.6, then 2.4/2.5
    for path in ("torch.distributed.fsdp._fully_shard._fully_shard", "torch.distributed._composable.fsdp.fully_shard"):
        try:
            module = importlib.import_module(path)
        except ImportError:
            continue
        for name in dir(module):
            if name.startswith("_init_default") and "mesh" in name:
                setattr(module, name, refuse)
                patched.append(path + "." + name)
    assert patched, "no default-mesh function found to patch"
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    state = parallel.build_state(TrainConfig.tiny(parallelism="fsdp"), torch.device("cpu"), False, None)
    types = {p.device_mesh.device_type for p in state.model.parameters()}
    dist.destroy_process_group()
    print(sorted(types))
""")


def test_fsdp_shards_use_a_mesh_of_the_run_device_not_the_hosts_default(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['cpu']"


def _both_gathers(rank: int, store_path: str, out: Any) -> None:
    """A forked rank of two: the digest of torch's full-state gather and of the host route."""
    import torch
    import torch.distributed as dist

    from trainwreck.trainer import parallel
    from trainwreck.trainer.config import TrainConfig
    from trainwreck.trainer.state import digest_of

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        state = parallel.build_state(TrainConfig.tiny(parallelism="fsdp"), torch.device("cpu"), False, None)
        for _ in range(2):  # AdamW moments that differ from zero, sharded like the parameters
            inputs = torch.randn(8, state.model.hidden[0].in_features)
            state.model(inputs, torch.arange(8), 7).pow(2).mean().backward()
            state.optimizer.step()
            state.optimizer.zero_grad()
        digests = [digest_of(sorted(model.items()), optim) for model, optim in
                   (parallel.full_state(state, on_host=False), parallel.full_state(state, on_host=True))]
        out.send((parallel.gathers_on_host(state), *digests))
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_the_full_state_gathered_from_host_copies_equals_torchs_full_state_dict(tmp_path: Path) -> None:
    # CUDA shards over gloo are gathered from host copies (torch's own gather of them died of
    # SIGSEGV on a GPU host); on the CPU both routes run, and must hash the same state.
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    ranks = [ctx.Process(target=_both_gathers, args=(rank, str(tmp_path / "store"), pipes[rank][1]))
             for rank in range(2)]
    for rank in ranks:
        rank.start()
    try:
        results = [receive.recv() if receive.poll(120) else None for receive, _ in pipes]
        for rank in ranks:
            rank.join(60)
        assert [rank.exitcode for rank in ranks] == [0, 0]
    finally:
        for rank in ranks:
            if rank.is_alive():
                rank.kill()
                rank.join()
    assert results[0] == results[1], results  # every rank hashes the same full state
    on_host, torch_gathered, host_gathered = results[0]
    assert on_host is False  # CPU shards keep torch's own gather
    assert host_gathered == torch_gathered
