"""Chapter stale (--full): what asynchronous updates cost, measured by benchmarks/staleness.py.

The benchmark first (k = 0 is the synchronous run; k delays every gradient by exactly k updates),
then the chapter built from a real measurement in this process, then, nightly, the real
`trainwreck handbook --chapters stale` checked by the truth test.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.report.handbooks import make_handbook
from trainwreck.benchmarks.staleness import SPEC, measure, train
from trainwreck.report.handbook import build_chapter
from trainwreck.report.truth import check_handbook
from trainwreck.harness.suites.handbook import default_chapters, get_case, get_chapter
from trainwreck.trainer.data import SyntheticDataset
from trainwreck.trainer.model import MLP
from trainwreck.rundir.layout import read_measurement, write_measurement


def _plain_sgd(steps: int) -> list[float]:
    """Synchronous training written out independently of benchmarks/staleness.py."""
    torch.manual_seed(SPEC.seed)
    model = MLP(SPEC)
    optimizer = torch.optim.SGD(model.parameters(), lr=SPEC.lr, momentum=0.9)
    data = SyntheticDataset(SPEC.seed, SPEC.dataset_size, SPEC.input_dim, SPEC.num_classes)
    order = torch.randperm(SPEC.dataset_size, generator=torch.Generator().manual_seed(SPEC.seed))
    losses = []
    for step in range(steps):
        ids = order[step * SPEC.global_batch:(step + 1) * SPEC.global_batch]
        x, y = data.batch(ids)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, ids, 0), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    return losses


def test_zero_staleness_is_the_synchronous_run_and_k_delays_every_gradient_by_k_updates() -> None:
    sync = train(SPEC, 6, 0)
    assert sync == _plain_sgd(6)
    stale = train(SPEC, 6, 2)
    # Updates 1 and 2 apply the gradient of the start (a worker that has heard nothing yet): the first
    # equals synchronous, the second already differs, and so does everything after it.
    assert stale[:2] == sync[:2] and stale[2] != sync[2]


def _said(chapter: dict[str, Any]) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", " ".join(s["text"] for s in chapter["sentences"] if s["text"])))


def test_the_stale_chapter_quotes_each_delay_and_names_the_costliest_from_the_measurement(tmp_path: Path) -> None:
    chapter_spec = get_chapter("stale")
    assert chapter_spec.full and chapter_spec not in default_chapters()
    assert get_case("stale-gradients").kind == "measure"
    # stored and read back as the handbook does (harness/suites/handbook.py run_measurement)
    write_measurement(tmp_path, {"command": "python -m trainwreck.benchmarks.staleness --steps 30", "measure": "staleness",
                                 **measure(steps=30)})
    measured = read_measurement(tmp_path)
    chapter = build_chapter(chapter_spec, {"stale-gradients": measured})
    text = _said(chapter)
    derived = {d["label"]: d["value"] for d in chapter["derived"]}
    for k in ("1", "2", "4"):
        gap = measured["stale"][k]["final_gap"]
        assert derived[f"stale_{k}_final_gap_percent"] == pytest.approx(100 * gap / measured["final_loss_sync"])
        assert f"{k} update(s) stale: final loss" in text
    worst = max(measured["stale"], key=lambda k: measured["stale"][k]["final_gap"])
    assert f"Here the costliest delay was {worst} update(s)" in text
    assert derived["stale_worst_final_gap"] == measured["stale"][worst]["final_gap"]
    stuck = measured["stale"][worst]["final_loss"] >= measured["loss_sync"][0]
    assert ("kept training from converging at all" in text) == stuck
    assert ("training still converged, more slowly" in text) != stuck


@pytest.fixture(scope="module")
def handbook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_handbook(tmp_path_factory, "stale", ["stale"])


@pytest.mark.slow  # one benchmark job of about 30 s on 2 cores: nightly
def test_the_real_stale_chapter_is_true_of_its_measurement(handbook: dict[str, Any]) -> None:
    assert handbook["code"] == 0 and handbook["chapters"]["stale"]["answered"]
    assert check_handbook(handbook["out"]) == []
    measured = handbook["reports"]["stale-gradients"]
    assert measured["stale"]["4"]["final_gap"] > 0  # four updates of delay cost loss at this learning rate
    assert "kept training from converging at all" in _said(handbook["chapters"]["stale"])  # 120 updates at lr 0.1
