"""A real torch DataLoader with worker processes and prefetch, SIGKILLed mid-epoch: which samples that
were in flight are lost or replayed, under three ways of remembering the loader's position.

    python -m trainwreck.benchmarks.loader [--workers 2] [--prefetch 2] [--batch 8] [--kill-after 5]

A loader child process iterates one shuffled epoch with `workers` worker processes, each asked for
`prefetch` batches ahead, and notes after every batch its loop consumed the batch's ids, how many
batches its batch sampler had handed to the workers by then, and (with torchdata installed)
StatefulDataLoader's state_dict. After `kill_after` batches it SIGKILLs itself; the workers' group
is then killed too (by the session this job started). A resume child then reads the rest of the
epoch from each remembered position:
- consumed: the number of batches the loop took (what a trainer that counts its own steps saves);
- dispatched: the batch sampler's own position, i.e. what a checkpoint of the sampler object holds
  once the workers have pulled batches ahead of the loop;
- stateful: torchdata's StatefulDataLoader.state_dict() taken after the last consumed batch.
The JSON gives, per position, the sample ids lost (never consumed) and replayed (consumed twice).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

DATASET, SEED = 256, 7


class Ids:
    """The dataset: sample i is the integer i (a worker fetches it; nothing else to load)."""

    def __len__(self) -> int:
        return DATASET

    def __getitem__(self, i: int) -> int:
        return i


class EpochBatches:
    """One shuffled epoch in batches, from batch `start` on, counting the batches handed out (the DataLoader
    iterates this in the loop's process, ahead of the loop, to keep every worker `prefetch` batches busy)."""

    def __init__(self, batch: int, start: int = 0) -> None:
        import torch

        order = torch.randperm(DATASET, generator=torch.Generator().manual_seed(SEED)).tolist()
        self.batches = [order[i:i + batch] for i in range(0, DATASET - batch + 1, batch)]
        self.start, self.handed = start, start

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.batches[self.start:]:
            self.handed += 1
            yield b

    def __len__(self) -> int:
        return len(self.batches) - self.start


def _loader(args: argparse.Namespace, start: int, stateful: bool) -> tuple[Any, EpochBatches]:
    sampler = EpochBatches(args.batch, start)
    kw = dict(batch_sampler=sampler, num_workers=args.workers, prefetch_factor=args.prefetch,
              collate_fn=lambda items: items)
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(Ids(), **kw), sampler
    import torch.utils.data

    return torch.utils.data.DataLoader(Ids(), **kw), sampler


def child(args: argparse.Namespace) -> None:
    """Consume batches, noting each; SIGKILL self after kill_after (0: read to the end of the epoch)."""
    out = open(args.child, "a", encoding="utf-8")
    stateful = args.resume_state is not None or args.stateful
    loader, sampler = _loader(args, args.start, stateful)
    if args.resume_state:
        loader.load_state_dict(pickle.loads(Path(args.resume_state).read_bytes()))
    for n, ids in enumerate(loader, start=1):
        note = {"ids": ids, "consumed": args.start + n, "dispatched": sampler.handed}
        if stateful:
            Path(args.child + ".state").write_bytes(pickle.dumps(loader.state_dict()))
        out.write(json.dumps(note) + "\n")
        out.flush()
        if n == args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, workers busy prefetching


def _run_child(args: argparse.Namespace, notes: Path, start: int, kill_after: int, stateful: bool = False,
               state: Path | None = None) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "trainwreck.benchmarks.loader", "--child", str(notes), "--start", str(start),
           "--kill-after", str(kill_after), "--workers", str(args.workers), "--prefetch", str(args.prefetch),
           "--batch", str(args.batch)] + (["--stateful"] if stateful else []) + (
              ["--resume-state", str(state)] if state else [])
    proc = subprocess.Popen(cmd, start_new_session=True)  # its own group: it and its workers
    try:
        proc.wait(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the workers it left: the group this job started
        except ProcessLookupError:
            pass
        proc.wait()
    return [json.loads(line) for line in notes.read_text().splitlines() if line.strip()]


def _outcome(before: list[dict[str, Any]], after: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    seen = [i for note in before + after for i in note["ids"]]
    epoch = set(range(DATASET - DATASET % batch))
    return {"lost": len(epoch - set(seen)), "replayed": len(seen) - len(set(seen)),
            "consumed_after_resume": sum(len(n["ids"]) for n in after)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stateful", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume-state", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    try:
        import torchdata
        version: str | None = torchdata.__version__
    except ImportError:
        version = None
    result: dict[str, Any] = {"workers": args.workers, "prefetch_factor": args.prefetch, "batch": args.batch,
                              "dataset": DATASET, "kill_after": args.kill_after, "torchdata": version}
    with tempfile.TemporaryDirectory() as tmp:
        before = _run_child(args, Path(tmp, "killed.jsonl"), 0, args.kill_after)
        last = before[-1]
        result.update(consumed_at_kill=last["consumed"], dispatched_at_kill=last["dispatched"],
                      in_flight_batches=last["dispatched"] - last["consumed"])
        positions = {"consumed": last["consumed"], "dispatched": last["dispatched"]}
        result["positions"] = {
            name: {"resumed_at_batch": start,
                   **_outcome(before, _run_child(args, Path(tmp, f"{name}.jsonl"), start, 0), args.batch)}
            for name, start in positions.items()}
        if version is not None:
            killed = _run_child(args, Path(tmp, "stateful-killed.jsonl"), 0, args.kill_after, stateful=True)
            state = Path(tmp, "stateful-killed.jsonl.state")
            after = _run_child(args, Path(tmp, "stateful.jsonl"), 0, 0, state=state)
            result["positions"]["stateful"] = _outcome(killed, after, args.batch)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
