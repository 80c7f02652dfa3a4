"""The probe: the one writer side of the run format (`trainwreck-run/1`), for any trainer.

The reference trainer writes every event through a Probe, and so can a user's own
torchrun script, a Hugging Face Trainer callback or a Lightning callback: the harness
and the checkers cannot tell them apart. A Probe owns this rank's event log, its
progress record for the watchdog and its fault points; run.json, file names and
attempt numbers come from rundir/layout.py, digests from one rule (`state_digest`).

Outside a harness and without a run directory, ``Probe.from_env()`` returns a disabled
probe whose methods do nothing, so an instrumented script still trains on its own.
"""
from __future__ import annotations

import atexit
import faulthandler
import gc
import hashlib
import importlib
import os
import signal
import zipfile
from collections import deque
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Any, ContextManager, Iterator, Sequence, Union

import torch

from trainwreck.trainer import hooks as fp
from trainwreck.rundir.events import FORMAT, EventLog
from trainwreck.trainer.hooks import Hooks, NoHooks
from trainwreck.trainer.probekit import ProbeError, TrackedLoader, Update, plain_ids, run_fields, seed_everything
from trainwreck.trainer.progress import PHASE_INDEX, ProgressBoard
from trainwreck.rundir.layout import (SAMPLINGS, RunDir, ensure_writable, iter_events, launcher_identity, read_run_json,
                                       standalone_attempt, write_json_atomic)
from trainwreck.trainer.state import model_optimizer_digest, state_digests

# The environment the harness gives a `--cmd` rank (beside torchrun's RANK, WORLD_SIZE, ...).
ENV_RUN_DIR = "TRAINWRECK_RUN_DIR"
ENV_ATTEMPT = "TRAINWRECK_ATTEMPT"
ENV_HOOKS = "TRAINWRECK_HOOKS"
"""`module:function` building the rank's fault hooks from run.json's plan: the harness names it
(faults/foreign.py), so the trainer package never imports faults/."""


POINT_PHASES = {fp.STEP_START: "start", fp.AFTER_DATA: "data", fp.AFTER_FORWARD: "forward",
                fp.AFTER_BACKWARD: "backward", fp.AFTER_OPTIMIZER: "optimizer"}
"""The watchdog phase a loop fault point reaches: every point is progress, so a rank waiting at
update k's start shows k (a harness signal at step k lands there) and a hung rank is behind."""


class _Find:
    """The `path` of commit/save/restore left out: the probe locates the checkpoint itself."""

    def __repr__(self) -> str:
        return "FIND"


FIND = _Find()
Located = Union[str, Path, None, _Find]


class Probe:
    """One rank's writer of the run format. Build it with `from_env` (any trainer) or
    directly (the reference trainer, which knows its context already)."""

    def __init__(self, run_dir: str | Path | None, rank: int = 0, world_size: int = 1, attempt: int = 0,
                 hooks: Hooks | None = None, pid: int | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.rank, self.world_size, self.attempt = rank, world_size, attempt
        self.hooks: Hooks = hooks or NoHooks()
        self.events: EventLog | None = None
        self.progress: ProgressBoard | None = None
        self.position = (-1, -1)
        """The furthest (step, phase index) this rank published: implicit progress never goes back."""
        self.entered = 0
        """The last update whose start this rank passed (its step_start point ran)."""
        self.stacks: IO[str] | None = None
        """The stack file SIGUSR1 writes to, when this probe armed the dump (under the harness)."""
        self.started = False
        self.last_step, self.last_digest = 0, ""
        """The update this rank last restored or completed, and its digest (for the helpers)."""
        self.current: Update | None = None
        self.drawn: deque[tuple[list[int], int | None]] = deque(maxlen=1)
        """Batches a tracked loader yielded since the last update began: (ids, the sampler's epoch)."""
        self.updates_per_epoch: int | None = None
        self.tracked: tuple[torch.nn.Module | None, torch.optim.Optimizer | None] = (None, None)
        self.roots: list[Path] = []
        """The folders this process's saves wrote under (`saving`): where `locate` looks first."""
        self.digested: tuple[torch.nn.Module | None, torch.optim.Optimizer | None] = (None, None)
        """The model and optimizer last digested (an update given them): what `checkpoint` digests."""
        if self.run_dir is not None:
            paths = RunDir(self.run_dir)
            self.events = EventLog(paths.rank_events(attempt, rank, pid if pid is not None else os.getpid()),
                                   attempt=attempt, rank=rank, world_size=world_size)
            self.progress = ProgressBoard(self.run_dir, attempt, rank)

    @classmethod
    def from_env(cls, run_dir: str | Path | None = None, hooks: Hooks | None = None, seed: int | None = None) -> Probe:
        """torchrun's contract (RANK, WORLD_SIZE) and TRAINWRECK_RUN_DIR / TRAINWRECK_ATTEMPT
        from the harness; the `run_dir` argument stands in when no harness set one. With
        `seed`, python, numpy and torch are seeded first (`seed`)."""
        if seed is not None:
            seed_everything(seed)
        env = os.environ
        chosen = env.get(ENV_RUN_DIR) or run_dir
        rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        if not 0 <= rank < world_size:
            raise ProbeError(f"RANK={rank} is outside WORLD_SIZE={world_size}; launch with torchrun or trainwreck run --cmd")
        if chosen is None:
            return cls(None, rank, world_size)
        root = Path(chosen)
        ensure_writable(root)
        if ENV_ATTEMPT in env:
            attempt = _env_int(ENV_ATTEMPT, 0)
        elif "RANK" in env:  # torchrun alone: every worker of one invocation agrees on the base
            attempt = standalone_attempt(root, _env_int("TORCHELASTIC_RESTART_COUNT", 0), launcher_identity())
        else:
            attempt = standalone_attempt(root, 0, None)
        probe = cls(root, rank, world_size, attempt, hooks)
        if hooks is None and env.get(ENV_HOOKS) and env.get(ENV_RUN_DIR):
            probe.hooks = _harness_hooks(root, env[ENV_HOOKS])
            assert probe.events is not None
            probe.hooks.bind(probe.events, rank, world_size, attempt)
        if env.get(ENV_RUN_DIR) and ENV_ATTEMPT in env:
            probe.stacks = arm_stack_dump(root, attempt, rank)
        if seed is not None:
            probe.emit("seed", seed=seed)
        atexit.register(probe.finish)
        return probe

    @property
    def enabled(self) -> bool:
        return self.events is not None

    # ----- run.json -----------------------------------------------------------------------

    def write_run_json(self, **spec: Any) -> None:
        """Rank 0 records the fields only the trainer knows: dataset_size, global_batch,
        drop_last, total_steps (plus any extras, such as `sampling="with_replacement"` for a
        script that draws its ids independently: random windows, a replacement sampler). Under plain torchrun it writes run.json;
        under `trainwreck run --cmd` the harness wrote one without them and they are added
        (the harness's own fields win). Rank > 0, a disabled probe, or fields already there:
        nothing is written."""
        if self.run_dir is None or self.rank != 0:
            return
        missing = [k for k in ("dataset_size", "global_batch", "drop_last", "total_steps") if k not in spec]
        if missing:
            raise ProbeError(f"write_run_json needs {', '.join(missing)}; pass them as keyword arguments")
        if spec.get("sampling", SAMPLINGS[0]) not in SAMPLINGS:
            raise ProbeError(f"write_run_json: sampling={spec['sampling']!r} must be one of {', '.join(map(repr, SAMPLINGS))}"
                             " (with_replacement: ids drawn independently, e.g. random windows)")
        path = RunDir(self.run_dir).run_json
        existing = read_run_json(self.run_dir) if path.exists() else {}
        if "dataset_size" in existing:
            return  # an earlier attempt wrote them; it describes the run
        defaults = {"format": FORMAT, "hang_timeout_s": None, "world_sizes": [self.world_size], "faults": [],
                    "launcher": "standalone"}
        write_json_atomic(path, {**defaults, **spec, **existing})

    # ----- events -------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        """Any event (the typed methods below are the contract's; this is for extra kinds)."""
        if self.events is not None:
            self.events.emit(kind, **fields)

    def start(self, **extra: Any) -> None:
        """The rank began; `extra` says how it runs (the reference trainer: its device and backend)."""
        self.started = True
        self.emit("start", pid=os.getpid(), **extra)
        self.phase(0, "start")

    def restore(self, step: int, checkpoint: str, digest: str, *, path: Located = FIND,
                buffers: str | None = None) -> None:
        """State after update `step` was loaded from `checkpoint`; with `path` (the checkpoint's
        file or folder on disk) the event also carries its `content` (checkpoint_content); without
        it, the probe looks for `checkpoint` itself (`locate`); `path=None`: no content. `buffers`:
        the digest of the loaded local buffers (`state_digests`)."""
        self.emit("restore", step=step, checkpoint=checkpoint, digest=digest, **_buffers(buffers),
                  **self._content_of(checkpoint, path))
        self.last_step, self.last_digest = step, digest

    def reject(self, checkpoint: str, reason: str, *, path: str | Path | None = None) -> None:
        """The script found `checkpoint` unusable and skipped it; with `path`, the event carries
        the `content` of the bytes it refused."""
        self.emit("reject", checkpoint=checkpoint, reason=reason, **_content(path))

    def batch(self, step: int, epoch: int, samples: Sequence[int]) -> None:
        samples = plain_ids(samples)  # a tensor or array of ids: JSON needs plain ints
        self.enter(step)
        self.emit("batch", step=step, epoch=epoch, samples=samples)
        self.advance(step, "data")

    def step(self, step: int, loss: float | None, digest: str, **extra: Any) -> None:
        """Update `step` is applied. Also tells the watchdog this rank is past it."""
        self.emit("step", step=step, loss=loss, digest=digest, **extra)
        self.last_step, self.last_digest = max(self.last_step, step), digest
        self.flush()
        self.advance(step, "optimizer")  # the watchdog's view: update `step` is done, nothing later yet

    def save(self, step: int, checkpoint: str, digest: str, *, durable_on_every_rank: bool,
             path: Located = FIND) -> bool:
        """Collective: every rank calls it with whether its own part of the checkpoint is
        durably written. Rank 0 emits `save` only when every rank said yes, because a
        checkpoint with one rank's file missing is not a checkpoint. Returns that answer.
        With `path`, the event carries the checkpoint's `content` (read by rank 0 once every
        rank's part is there)."""
        everyone = all_ranks_agree(durable_on_every_rank, self.world_size)
        if everyone and self.rank == 0:
            self.emit("save", step=step, checkpoint=checkpoint, digest=digest, **self._content_of(checkpoint, path))
        return everyone

    def commit(self, step: int, checkpoint: str, digest: str, *, path: Located = FIND,
               buffers: str | None = None) -> None:
        """The calling rank alone wrote the whole checkpoint (the state of every replica) and it
        is durable now: report it at once, no collective. A rank-0-only writer must use this,
        not `save`: a peer that dies after the write would otherwise leave a durable
        checkpoint that was never reported, which the next attempt restores anyway.
        With `path` (or found by `locate`), the event carries the checkpoint's `content`; with
        `buffers`, the digest of the local buffers saved (`state_digests`)."""
        self.emit("save", step=step, checkpoint=checkpoint, digest=digest, **_buffers(buffers),
                  **self._content_of(checkpoint, path))

    def recover(self, step: int, checkpoint: str, digest: str, writer_attempt: int, *,
                path: str | Path | None = None) -> None:
        """Rank 0, before `restore`: the checkpoint it is about to load is provably committed (e.g.
        checksum-named and atomically renamed into place), but its writer may have died between
        that commit and its `save` event; two durable records cannot be written atomically, so
        the log is completed on the writer's behalf (`save` with `recovered: true`), once. Call
        it only with a proof of commit, never to cover up a checkpoint that may be partial."""
        if self.rank != 0 or self.run_dir is None or _announced(self.run_dir, checkpoint, writer_attempt):
            return
        self.emit("save", attempt=writer_attempt, step=step, checkpoint=checkpoint, digest=digest, recovered=True,
                  **_content(path))

    def locate(self, checkpoint: str) -> Path | None:
        """The file or folder a checkpoint name given without `path=` stands for, so the calls
        written before `path` existed (`commit`, `save`, `restore`) still report the bytes, and a
        snapshot overwritten in place is known by them: under a folder this process gave
        `saving`, under RUN_DIR/checkpoints (`path`), or the name as a path itself. None: not
        found (or no run directory), and the event carries no content, as before."""
        if self.run_dir is None:
            return None
        given = Path(checkpoint)
        for candidate in [*(root / given for root in self.roots), self.run_dir / "checkpoints" / given, given]:
            if not candidate.is_symlink() and (candidate.is_file() or candidate.is_dir()):
                return candidate
        return None

    def _content_of(self, checkpoint: str, path: Located) -> dict[str, str]:
        return _content(self.locate(checkpoint) if path is FIND else path)  # type: ignore[arg-type]

    def prune(self, checkpoint: str) -> None:
        self.emit("prune", checkpoint=checkpoint)

    def end(self, final_step: int, status: str = "completed") -> None:
        """Rank 0 of a run no harness supervises says the job is over (the harness does otherwise)."""
        if self.rank == 0 and self.run_dir is not None and not os.environ.get(ENV_ATTEMPT):
            self.emit("end", status=status, final_step=final_step)

    # ----- the ten-line helpers (trainer/probekit.py) -------------------------------------

    def seed(self, seed: int) -> None:
        """Seed python, numpy and torch at once (before building the data and the model): an
        uninterrupted run must repeat itself exactly, or no restart can be judged against it."""
        seed_everything(seed)
        self.emit("seed", seed=seed)

    def path(self, name: str) -> str:
        """Where a checkpoint named `name` should live: under the harness (or with a run dir),
        `RUN_DIR/checkpoints/name`, so every attempt finds it and no two runs share it; on its
        own, `name` unchanged."""
        if self.run_dir is None:
            return name
        folder = self.run_dir / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder / name)

    def loader(self, loader: Any, *, epochs: int | None = None, total_steps: int | None = None,
               batches_per_update: int = 1) -> Any:
        """The script's own DataLoader, noting the sample ids of every batch it yields (for the
        next `update`). With `epochs` (or `total_steps`), rank 0 also writes run.json's dataset
        fields from it: dataset size, global batch (batch size x world size x
        batches_per_update), drop_last, total updates."""
        if batches_per_update < 1:
            raise ProbeError(f"batches_per_update={batches_per_update} must be >= 1 (batches drawn per update)")
        self.drawn = deque(maxlen=batches_per_update)
        self.updates_per_epoch = max(len(loader) // batches_per_update, 1) if hasattr(loader, "__len__") else None
        tracked = TrackedLoader(loader, lambda ids, epoch: self.drawn.append((ids, epoch)))
        if self.enabled and (epochs is not None or total_steps is not None):
            self.write_run_json(**run_fields(loader, self.world_size, batches_per_update, epochs, total_steps))
        return tracked

    def track(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """The model and optimizer whose state the helpers digest (or pass them to each call)."""
        self.tracked = (model, optimizer)

    def update(self, step: int | None = None, *, model: torch.nn.Module | None = None,
               optimizer: torch.optim.Optimizer | None = None, epoch: int | None = None,
               samples: Sequence[int] | None = None, enabled: bool = True) -> Update:
        """`with probe.update(...):` around one optimizer update (forward, backward, step). On
        entry: progress, the update's fault points, and `batch` with the ids the tracked loader
        yielded since the last update (or `samples`), or, when no id is known yet, on exit with the
        ids the body gave `probe.samples` (micro-batches fetched inside the update) or the tracked
        loader yielded inside it; on a clean exit: `step` with the global
        mean of the loss given to `probe.loss` and the digest of the model and optimizer.
        `step` defaults to the update after the last one restored or completed;
        `enabled=False` makes it a no-op (an evaluation batch in the same loop)."""
        number = self.last_step + 1 if step is None else step
        on = enabled and self.enabled
        if on:
            self._ensure_started()
        return Update(self, number, epoch, samples, lambda: self._digests(model, optimizer), on)

    def samples(self, ids: Sequence[int] | Any) -> None:
        """One micro-batch's sample ids (a list, tensor or array), inside `with probe.update(...)`:
        each call adds to the update's batch, written when the update ends. For a script that
        fetches its micro-batches inside the accumulation loop, so their ids are not known when
        the update begins."""
        if self.current is not None:
            self.current.samples(ids)
        elif self.enabled:
            raise ProbeError("probe.samples(ids) adds to the update in progress: call it inside "
                             "`with probe.update(...)`, or pass samples= to probe.update")

    def loss(self, value: Any) -> None:
        """This rank's loss of the update in progress (a tensor or a number): the update's
        `step` carries its mean over ranks. Outside an update it is ignored."""
        if self.current is not None:
            self.current.loss = value

    @contextmanager
    def checkpoint(self, path: str | Path, step: int | None = None) -> Iterator[None]:
        """`with probe.checkpoint(path):` around the script's own save of the whole checkpoint
        (by one rank, or by every rank to one path): its file operations are crash points under
        the harness; after it the file (or folder) is fsynced and reported (`save`) with its
        content digest and the digests of the state saved, taken now: evaluation between the
        update and the save (under DDP it broadcasts rank 0's buffers) changes what is written.
        Bytes that are not whole are never reported (`_whole`): when every rank writes one
        path, another rank's write may be in progress, or torn. `step` defaults to the last
        completed update."""
        if not self.enabled:
            yield
            return
        self._ensure_started()
        number = self.last_step if step is None else step
        target = Path(path)
        with self.saving(number, target.parent):
            yield
        fields = self._saved_state(number)
        _fsync_tree(target)
        content = checkpoint_content(target)  # hashed, then checked: bytes torn before the check are never reported
        if _whole(target):  # what `commit` writes, with the digests of the state saved
            self.emit("save", step=number, checkpoint=target.name, **fields, content=content)

    def restored(self, path: str | Path, step: int | None = None, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        """After the script loaded its checkpoint at `path`: `restore` with the update the script
        believes it holds (`step`), the digest of the loaded state, and the file's content, by
        which the judge finds the save that wrote those bytes. Without `step` (a script that counts
        epochs, whose updates per epoch change with the world size), the step is the one of the
        recorded save whose bytes these are."""
        if not self.enabled:
            return
        self._ensure_started()
        fields = self._digests(model, optimizer)
        content = self._content_of(Path(path).name, path).get("content")
        step = self.saved_step(content, path) if step is None else step
        self.restore(step, Path(path).name, fields["digest"], path=path, buffers=fields.get("buffers"))

    def saved_step(self, content: str | None, path: str | Path) -> int:
        """The update of the newest recorded save whose bytes were `content` (this run's events)."""
        saves = [ev for ev in iter_events(self.run_dir, batches=False) if ev.get("kind") == "save"
                 and content is not None and ev.get("content") == content and type(ev.get("step")) is int] \
            if self.run_dir is not None else []
        if not saves:
            raise ProbeError(f"probe.restored({str(path)!r}) without a step: no save recorded in this run wrote "
                             "those bytes; pass the update the checkpoint holds as step=")
        return max(saves, key=lambda ev: ev.get("t", 0.0))["step"]

    def take_samples(self, step: int, samples: Sequence[int] | None,
                     epoch: int | None) -> tuple[list[int] | None, int]:
        """The ids of update `step`, beginning now: given, or drawn from the tracked loader since
        the last update (None: nothing to report); and its epoch: given, else the sampler's
        (DistributedSampler.set_epoch), else counted in updates of the loader's length."""
        drawn = list(self.drawn)
        self.drawn.clear()
        if epoch is None:
            epoch = drawn[-1][1] if drawn else None
        if epoch is None:
            epoch = (step - 1) // self.updates_per_epoch if self.updates_per_epoch else 0
        if samples is not None:
            return plain_ids(samples), epoch
        return ([i for ids, _ in drawn for i in ids] if drawn else None), epoch

    def _ensure_started(self) -> None:
        if not self.started:
            self.start()

    def _digests(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> dict[str, str]:
        """An event's `digest` and, for a model with local buffers, `buffers` (`state_digests`)."""
        if model is not None:
            self.digested = (model, optimizer)
        model = model if model is not None else self.tracked[0]
        optimizer = optimizer if optimizer is not None else self.tracked[1]
        if model is None:
            raise ProbeError("the probe has no model to digest: pass model= and optimizer= to this call, "
                             "or call probe.track(model, optimizer) once")
        digest, buffers = state_digests(getattr(model, "module", model), optimizer)
        return {"digest": digest, **_buffers(buffers)}

    def _saved_state(self, step: int) -> dict[str, str]:
        """The digests of the state a checkpoint of update `step` holds, taken now: of the tracked
        model, else of the one the updates digested; without either (a script that passes its own
        digests), the digest the probe last reported for that update."""
        model, optimizer = self.tracked if self.tracked[0] is not None else self.digested
        if model is None and step == self.last_step and self.last_digest:
            return {"digest": self.last_digest}
        return self._digests(model, optimizer)

    # ----- watchdog and faults ------------------------------------------------------------

    def phase(self, step: int, name: str) -> None:
        """Progress for the watchdog: this rank is in phase `name` of update `step`
        (trainer/progress.py BOARD_PHASES). Published as given, even backwards."""
        self.position = (step, PHASE_INDEX[name])
        if self.progress is not None:
            self.progress.publish(step, name)

    def advance(self, step: int, name: str) -> None:
        """Progress implied by a call (a point, `batch`, `step`): published only when it is
        further than what this rank published already, so a late `step` event (HF logs the
        loss after the update) never moves the watchdog's view back."""
        if (step, PHASE_INDEX[name]) > self.position:
            self.phase(step, name)

    def enter(self, step: int) -> None:
        """This rank starts update `step` (once per update): progress first, then the
        `step_start` fault point, where the rank also waits for a harness signal planned at
        this step. So a signal at step k lands before update k's first collective, for any
        trainer that calls `point("step_start", k)`, `batch(k, ...)` or `update(k)`."""
        if step <= self.entered:
            return
        self.entered = step
        self.advance(step, "start")
        self.hooks.point(fp.STEP_START, step)

    def point(self, name: str, step: int, **ctx: Any) -> None:
        """A named in-rank fault point (trainer/hooks.py names them). A loop point is progress
        too, and a later update's point enters that update first (its `step_start`)."""
        if name == fp.STEP_START and step > self.entered:
            self.enter(step)
            return
        if name in POINT_PHASES and step > self.entered:
            self.enter(step)
        if name in POINT_PHASES:
            self.advance(step, POINT_PHASES[name])
        self.hooks.point(name, step, **ctx)

    def saving(self, step: int, root: str | Path) -> ContextManager[Any]:
        """Wrap the framework's own checkpoint write after update `step` (files under `root`):
        under the harness its file operations are fault points (faults/foreign.py); otherwise,
        or with hooks that have none, it only tells the watchdog (which then allows a save's
        longer budget: a framework's save may be slow)."""
        self.phase(step, "checkpoint")
        if Path(root) not in self.roots:  # where `locate` finds a checkpoint the script names without a path
            self.roots.append(Path(root))
        scope = getattr(self.hooks, "saving", None)
        return scope(step, Path(root)) if scope is not None else nullcontext()

    def finish(self) -> None:
        """At interpreter exit (registered by `from_env`): the script's own code is over, so this
        rank is only exiting ("done": the watchdog calls no slow teardown a hang), every
        buffered event is written, and unreachable objects (a DDP model) are collected."""
        if self.progress is not None:
            self.phase(max(self.position[0], self.last_step, 0), "done")
        self.close()
        # A DDP model the script let go of is still held by reference cycles, and with it the
        # gloo process group; freed only in interpreter teardown, gloo's threads die running and
        # the rank aborts (-6) now and then. Collected here, the interpreter is still whole.
        gc.collect()

    def flush(self) -> None:
        if self.events is not None:
            self.events.flush()

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self.progress is not None:
            self.progress.close()
        if self.stacks is not None:  # the previous handler (chained, or none) comes back
            faulthandler.unregister(signal.SIGUSR1)
            self.stacks.close()
        self.events = self.progress = self.stacks = None

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ProbeError(f"{name}={raw!r} is not an integer; set it to a rank count or unset it") from None


def checkpoint_content(path: str | Path) -> str:
    """sha256 (hex) of a checkpoint as it is on disk: one file's bytes, or for a folder every
    regular file's path relative to it and bytes, in sorted path order. Symlinks are never
    followed (a link is not the checkpoint's content). Equal bytes give equal content, so a
    restore is matched to the save that wrote those bytes, whatever the file is called."""
    root = Path(path)
    h = hashlib.sha256()
    if root.is_symlink() or not root.exists():
        raise ProbeError(f"checkpoint {root} is not a file or folder on disk; pass the path it was saved to")
    if root.is_file():
        _hash_file(h, root)
        return h.hexdigest()
    files = []
    for folder, dirs, names in os.walk(root):  # followlinks=False: linked folders are not entered
        files += [Path(folder) / n for n in names if (Path(folder) / n).is_file() and not (Path(folder) / n).is_symlink()]
    for file in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        rel = file.relative_to(root).as_posix().encode()
        h.update(len(rel).to_bytes(8, "big") + rel)
        h.update(file.stat().st_size.to_bytes(8, "big"))
        _hash_file(h, file)
    return h.hexdigest()


def _hash_file(h: Any, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)


def _fsync_tree(path: Path) -> None:
    """Make a checkpoint the script wrote durable: its file(s), then the folder holding it."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for item in [*files, path.parent]:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _content(path: str | Path | None) -> dict[str, str]:
    return {} if path is None else {"content": checkpoint_content(path)}


def _buffers(buffers: str | None) -> dict[str, str]:
    return {} if buffers is None else {"buffers": buffers}


def _whole(path: Path) -> bool:
    """Whether a checkpoint's bytes are whole, as far as its format tells. A zip archive
    (torch.save's format) is whole when its directory, written last, is there and every member
    reads back with its CRC-32 (a file several ranks wrote at once can be a mix of their bytes);
    a file of fewer than 4 bytes is a write in progress. A folder, or any other format, cannot
    say and counts as whole. A torn torch.save (a rank killed inside its write) fails here."""
    if not path.is_file():
        return True
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4:
        return False
    if head != b"PK\x03\x04":
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if not member.CRC and member.file_size:  # torch told not to compute CRCs: no check
                    continue
                with archive.open(member) as stream:  # reading to the end checks the CRC
                    while stream.read(1 << 20):
                        pass
        return True
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def arm_stack_dump(run_dir: Path, attempt: int, rank: int) -> IO[str]:
    """SIGUSR1 writes every thread's Python stack into the rank's stack file (the watchdog's
    dump on a hang, as harness/launch/rank.py arms it for the reference trainer). A handler the
    script installed before is chained, so it still runs; one installed later replaces this."""
    path = RunDir(run_dir).rank_stacks(attempt, rank, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")
    previous = signal.getsignal(signal.SIGUSR1)
    # chain=True re-raises into the previous handler: into SIG_DFL that would kill the rank.
    chain = previous not in (signal.SIG_DFL, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=chain)
    return handle


def _announced(run_dir: Path, checkpoint: str, attempt: int) -> bool:
    """Whether attempt `attempt` or a later one already logged this checkpoint's `save`."""
    return any(e["kind"] == "save" and e.get("checkpoint") == checkpoint and isinstance(e.get("attempt"), int)
               and e["attempt"] >= attempt for e in iter_events(run_dir, batches=False))


def _harness_hooks(run_dir: Path, factory: str) -> Hooks:
    """The hooks the harness named for this rank, built from the plan in its run.json."""
    module, _, name = factory.partition(":")
    if not name:
        raise ProbeError(f"{ENV_HOOKS}={factory!r} must look like 'package.module:function'")
    plan = read_run_json(run_dir).get("faults") or []
    return getattr(importlib.import_module(module), name)(plan)


def all_ranks_agree(value: bool, world_size: int) -> bool:
    """True when every rank passed True: one all-reduce (MIN) over the default process
    group; a lone rank, or no process group, decides alone."""
    import torch.distributed as dist

    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return bool(value)
    flag = torch.tensor([1 if value else 0], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """sha256 (16 hex digits) of parameters, optimizer state and the buffers replicas keep
    equal, in a fixed order: equal states give equal digests, and every DDP replica gives the
    same one. A BatchNorm's running statistics differ between DDP replicas by design and are
    left out (trainer/state.py state_digests digests them apart, as the helpers' `buffers`).
    The same rule as the reference trainer's digest (trainer/state.py model_optimizer_digest).
    A DDP/FSDP-style wrapper's `module.` prefix is dropped, so wrapped and bare agree."""
    return model_optimizer_digest(getattr(model, "module", model), optimizer)
