"""GPU figures: checkpoints of CUDA-resident state and hang detection on nccl (skipped without CUDA).

The same contenders as benchmarks/checkpoint.py, with the state on the GPU: trainwreck's durable,
checksummed save against `torch.save` + fsync of the same tensors to a new file (both copy the
tensors to host memory inside the timed call), and the verified load back onto the GPU against
`torch.load(map_location=...)`. The asynchronous save's stall is set against a real training step
on the GPU (a stack of matmuls running at least as long as a synchronous save, so the background
persist overlaps it), as a fraction of that step. Every figure names the device and the date.

`python -m trainwreck.benchmarks.gpu [--device cpu] [--sizes 1mb]`: the CPU runs the same code, so a
machine without a GPU checks that the measurement works (tests/benchmarks); its figures are not GPU
figures and say so in `gpu_device`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from trainwreck.benchmarks.checkpoint import (LOAD_ROUNDS, SIZES_MB, _alternating, _alternating_samples,
                                              _async_stall, _medians, _state, _torch_save_new_files)
from trainwreck.trainer.checkpoint import CheckpointStore, Payload, from_bytes
from trainwreck.rundir.events import EventLog
from trainwreck.trainer.hooks import NoHooks
from trainwreck.trainer.storage import LocalStorage

STEP_MATMUL = 4096
"""Side of the square matmuls that make the stand-in training step: about 0.14 TFLOP each, a few
milliseconds on a current GPU, so a step is a few hundred of them."""


def _progress(text: str) -> None:
    """A line on stderr as each part starts: a 1 GB part takes a minute on a slow disk."""
    print(f"[benchmarks] gpu: {text}", file=sys.stderr, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _on(device: torch.device, fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn`, finished on the device before the clock stops (CUDA calls return before the work is done)."""
    def call() -> Any:
        result = fn()
        _sync(device)
        return result
    return call


def gpu_step(device: torch.device, seconds: float) -> Callable[[], None]:
    """A training step's worth of GPU work: matmuls until `seconds` have passed, synchronised."""
    side = STEP_MATMUL if device.type == "cuda" else 256
    a = torch.randn(side, side, device=device)

    def work() -> None:
        x, deadline = a, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            x = torch.tanh(x @ a)
            _sync(device)
    return work


def bench_device_size(megabytes: int, repeats: int, root: Path, device: torch.device) -> dict[str, float]:
    """Save, load and async-stall seconds of `megabytes` of float32 state resident on `device`."""
    state = {name: tensor.to(device) for name, tensor in _state(megabytes).items()}
    _sync(device)
    events = EventLog(root / "events.jsonl")
    (root / "ckpt").mkdir(exist_ok=True)
    store = CheckpointStore(LocalStorage(root / "ckpt"), events, NoHooks(), keep_last=2)
    step = iter(range(1, 10_000))
    plain_path = root / "plain.pt"

    def verified_save() -> None:
        store.save(next(step), {"model.pt": Payload(state)}, {"config_identity": "bench", "digest": None})

    def verified_load() -> dict[str, torch.Tensor]:
        loaded = from_bytes(store.select("bench").files["model.pt"])  # type: ignore[union-attr]
        return {name: tensor.to(device, non_blocking=False) for name, tensor in loaded.items()}

    durable = _torch_save_new_files(state, root, "plain-durable", store.keep_last, durable=True)
    torch.save(state, plain_path)
    rounds = max(repeats, 3)
    steady = store.keep_last + 1
    _progress(f"{megabytes} MB on {device}: verified save against torch.save + fsync, {rounds} rounds")
    saves = _alternating({"verified_save_s": _on(device, verified_save), "plain_durable_save_s": _on(device, durable)},
                         rounds, {"verified_save_s": steady, "plain_durable_save_s": steady})
    _progress(f"{megabytes} MB on {device}: verified load against torch.load")
    samples = _alternating_samples(
        {"verified_load_s": _on(device, verified_load),
         "plain_load_s": _on(device, lambda: torch.load(plain_path, map_location=device, weights_only=True))},
        max(rounds, LOAD_ROUNDS) if megabytes < 1024 else rounds, {})
    loads = _medians(samples)
    loads["verified_load_paired_ratio"] = statistics.median(
        v / p for v, p in zip(samples["verified_load_s"], samples["plain_load_s"]))
    # The step must outlast the persist for the save to hide behind it: at least a synchronous save.
    step_s = max(0.05, saves["verified_save_s"])
    _progress(f"{megabytes} MB on {device}: asynchronous save beside a {step_s:.2f} s step")
    stall = _async_stall(store, state, step, repeats, work=gpu_step(device, step_s))
    events.close()
    return {**saves, **loads, **stall, "training_step_s": step_s}


def bench_gpu_checkpoint(device: torch.device, sizes: tuple[str, ...] = ("100mb", "1gb"),
                         repeats: int = 2) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sizes:
        root = Path(tempfile.mkdtemp(prefix="tw-gpu-ckpt-", dir=os.environ.get("TRAINWRECK_BENCH_DIR")))
        try:
            figures = bench_device_size(SIZES_MB[name], repeats, root, device)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        out[f"gpu_save_ratio_vs_fsynced_{name}"] = round(figures["verified_save_s"] / figures["plain_durable_save_s"], 3)
        out[f"gpu_verified_load_ratio_{name}"] = round(figures["verified_load_paired_ratio"], 3)
        out[f"gpu_async_stall_of_step_{name}"] = round(figures["async_stall_s"] / figures["training_step_s"], 3)
        out[f"gpu_checkpoint_{name}"] = {k: round(v, 4) for k, v in figures.items()}
    return out


def bench_nccl_hang(hangs: int = 3, timeout_s: float = 1.0) -> dict[str, Any]:
    """Fault-to-detection seconds of the hang-detect scenario on nccl, one rank on one GPU
    (nccl runs one rank per GPU; the SIGSTOP moves to rank 0)."""
    from trainwreck.benchmarks.scenarios import cpu_scenario, hang_latencies
    from trainwreck.trainer.config import backend_fields

    _progress(f"nccl hang latency, {hangs} hang-detect runs at world size 1")
    base = cpu_scenario("hang-detect")
    plan = tuple({**fault, "rank": 0} for fault in base.plan)
    scenario = replace(base, plan=plan, world_sizes=(1,), config={**base.config, **backend_fields("nccl")})
    latencies, invalid = hang_latencies(hangs, timeout_s, scenario=scenario)
    return {"gpu_nccl_hang_latency_max_s": round(max(latencies), 3),
            "gpu_nccl_hang_latency_median_s": round(statistics.median(latencies), 3),
            "gpu_nccl_hang_runs": hangs, "gpu_nccl_hang_invalid_runs": invalid}


def bench_gpu(quick: bool = True, device: str | None = None, sizes: tuple[str, ...] = ("100mb", "1gb")) -> dict[str, Any]:
    """Every GPU figure, or {"gpu": "skipped: ..."} on a machine without CUDA (device None)."""
    if device is None and not torch.cuda.is_available():
        return {"gpu": "skipped: no CUDA device on this machine"}
    target = torch.device(device or "cuda")
    name = torch.cuda.get_device_name(target) if target.type == "cuda" else f"{target.type} (not a GPU figure)"
    results: dict[str, Any] = {"gpu_device": name, "gpu_date": datetime.date.today().isoformat(),
                               "gpu_torch": torch.__version__}
    results.update(bench_gpu_checkpoint(target, sizes, repeats=2 if quick else 3))
    if target.type == "cuda":
        results.update(bench_nccl_hang(hangs=3 if quick else 10))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwreck.benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu (checks the code only)")
    parser.add_argument("--sizes", default="100mb,1gb", help=f"comma-separated, of {', '.join(SIZES_MB)}")
    args = parser.parse_args(argv)
    sizes = tuple(s for s in args.sizes.split(",") if s)
    unknown = [s for s in sizes if s not in SIZES_MB]
    if unknown or not sizes:
        print(f"--sizes {args.sizes!r}: expected some of {', '.join(SIZES_MB)}, e.g. --sizes 100mb,1gb", file=sys.stderr)
        return 2
    print(json.dumps(bench_gpu(True, args.device, sizes), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
