"""The streaming save and the hash-while-reading load: one pass over each file, and the
storage seam still sees (and faults still hit) every write."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from blake3 import blake3

from tests.trainer.test_checkpoint_store import IDENTITY, make_store
from trainwreck.faults.powerloss import PowerLossRecorder
from trainwreck.faults.storage import FaultyStorage, RecordingStorage, StepClock
from trainwreck.trainer.checkpoint import HashingSink, Payload, from_bytes, payload_object
from trainwreck.trainer.storage import LocalStorage, OnChunk

META = {"config_identity": IDENTITY, "digest": "d", "world_size": 1}


def _state(numel: int = 600_000) -> dict[str, torch.Tensor]:
    """Two tensors of which one is over PARALLEL_HASH_MIN, so both hashing paths run."""
    generator = torch.Generator().manual_seed(3)
    return {"big": torch.randn(numel, generator=generator), "small": torch.arange(7.0)}


class CountingReads(LocalStorage):
    """LocalStorage that counts reads per path (a verified load must read each file once)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def read(self, path: str, on_chunk: OnChunk | None = None, limit: int | None = None) -> bytes:
        self.reads[path] = self.reads.get(path, 0) + 1
        return super().read(path, on_chunk, limit)


def test_a_streamed_payload_file_matches_its_manifest_entry_and_loads_back_equal(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    state = _state()
    store.save(4, {"model.pt": Payload(state), "raw.pt": b"crafted bytes"}, META)
    manifest = json.loads((tmp_path / "checkpoints/step-00000004/manifest.json").read_text())
    for name in ("model.pt", "raw.pt"):
        on_disk = (tmp_path / "checkpoints/step-00000004" / name).read_bytes()
        assert manifest["files"][name] == {"size": len(on_disk), "blake3": blake3(on_disk).hexdigest()}
    loaded = from_bytes((tmp_path / "checkpoints/step-00000004/model.pt").read_bytes())
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)


def test_the_hashing_sink_hashes_every_chunk_in_order_whatever_its_size(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    chunks = [b"a" * 10, os.urandom(3 << 20), b"b" * 5000, os.urandom(1 << 20)]
    out = io.BytesIO()
    with ThreadPoolExecutor(1) as pool:
        sink = HashingSink(out, pool)
        for chunk in chunks:
            sink.write(memoryview(chunk))
    joined = b"".join(chunks)
    assert out.getvalue() == joined and sink.size == len(joined)
    assert sink.digest.hexdigest() == blake3(joined).hexdigest()
    assert sink.digest.hexdigest() != blake3(b"".join(reversed(chunks))).hexdigest()


def test_a_verified_load_reads_each_file_once_and_decodes_the_bytes_it_hashed(tmp_path: Path) -> None:
    storage = CountingReads(tmp_path / "checkpoints")
    store = make_store(tmp_path, storage=storage)
    store.save(4, {"model.pt": Payload(_state())}, META)
    storage.reads.clear()
    chosen = store.select(IDENTITY)
    assert chosen is not None
    assert storage.reads["step-00000004/model.pt"] == 1, "a file read twice can change between hash and load"
    assert torch.equal(from_bytes(chosen.files["model.pt"])["big"], _state()["big"])


def test_a_flipped_byte_in_a_streamed_file_fails_the_hash_checked_while_reading(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.save(4, {"model.pt": Payload(_state())}, META)
    store.save(8, {"model.pt": Payload(_state())}, META)
    path = tmp_path / "checkpoints/step-00000008/model.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    chosen = store.select(IDENTITY)
    assert chosen is not None and chosen.name == "step-00000004"


def test_a_streamed_write_is_recorded_as_one_write_with_its_size(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    recorder = RecordingStorage(LocalStorage(tmp_path / "checkpoints"))
    store = make_store(tmp_path, storage=recorder)
    store.save(4, {"model.pt": Payload(_state())}, META)
    writes = [op for op in recorder.ops if op.name == "write" and op.args[0].endswith("/model.pt")]
    assert len(writes) == 1
    assert writes[0].size == (tmp_path / "checkpoints/step-00000004/model.pt").stat().st_size


def test_a_torn_write_fault_tears_a_streamed_file_at_half_its_bytes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    recorded: list[str] = []

    class Crashed(Exception):
        pass

    def crash() -> None:
        raise Crashed

    fault = {"id": "torn", "kind": "torn_write", "step": 0, "nth": 1}
    faulty = FaultyStorage(LocalStorage(root), [fault], StepClock(), lambda f, detail, **_: recorded.append(detail),
                           crash=crash)
    payload = Payload(_state())
    full = io.BytesIO()
    torch.save(payload.obj, full)
    with pytest.raises(Crashed):
        faulty.write_stream("model.pt", lambda sink: torch.save(payload.obj, sink))
    assert recorded and "tore the write of model.pt" in recorded[0]
    torn = (root / "model.pt").read_bytes()
    assert 0 < len(torn) < len(full.getvalue()) and len(torn) == len(full.getvalue()) // 2


def test_the_power_loss_recorder_sees_a_streamed_write_as_create_data_and_fsync(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    recorder = PowerLossRecorder(LocalStorage(root), root)
    recorder.start()
    recorder.write_stream("f.bin", lambda sink: (sink.write(b"abc"), sink.write(b"def")) and None)
    assert [op.kind for op in recorder.log.ops] == ["create", "data", "fsync_file"]
    assert recorder.log.ops[1].data == b"abcdef" == (root / "f.bin").read_bytes()


def test_a_streamed_write_onto_a_planted_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (root / "model.pt").symlink_to(outside)
    with pytest.raises(OSError):
        LocalStorage(root).write_stream("model.pt", lambda sink: sink.write(b"evil") and None)
    assert outside.read_text() == "untouched"


def test_payload_object_reads_both_kinds_of_file_content() -> None:
    obj: dict[str, Any] = {"step": 3}
    data = io.BytesIO()
    torch.save(obj, data)
    assert payload_object(Payload(obj)) == obj == payload_object(data.getvalue())


class _RunsCode:
    """Unpickling this would call a function: a weights-only load must refuse it."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.getenv, ("HOME",))


def test_the_zero_copy_decode_of_a_verified_buffer_still_refuses_a_pickle_that_runs_code() -> None:
    crafted = io.BytesIO()
    torch.save({"w": torch.ones(2), "evil": _RunsCode()}, crafted)
    with pytest.raises(Exception, match="(?i)weights.only|unsupported global"):
        from_bytes(bytearray(crafted.getvalue()))
    benign = io.BytesIO()
    torch.save({"w": torch.ones(2)}, benign)
    assert torch.equal(from_bytes(bytearray(benign.getvalue()))["w"], torch.ones(2))
