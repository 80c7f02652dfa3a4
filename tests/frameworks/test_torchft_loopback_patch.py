"""The nightly torchft's rendezvous store is kept on loopback by `loopback_only()`
(trainer/frameworks/torchft_adapter.py `_loopback_handle`), checked without the nightly: the
extra pins 0.2.0, which has no such store, and the rows of test_torchft.py run the nightly
only from another venv."""
from __future__ import annotations

import json
import socket
from typing import Any

import psutil
import pytest

pytest.importorskip("torchft")

from tests.frameworks.test_torchft import own_listeners  # noqa: E402


def test_the_nightly_s_rendezvous_store_is_started_on_loopback_and_advertised_as_such() -> None:
    # torchft-nightly's ProcessGroup.get_reconfigure_handle, reduced to what the patch relies
    # on: it reuses `_rendezvous_store` when set (else it would start a store on every
    # interface) and advertises the hostname. 0.2.0, the extra's pin, has no such method.
    from trainwreck.trainer.frameworks.torchft_adapter import _loopback_handle

    class NightlyGroup:
        _rendezvous_store: Any = None

        def get_reconfigure_handle(self) -> str:
            assert self._rendezvous_store is not None, "the patch starts the store before torchft looks"
            return json.dumps({"id": "g0", "store": f"{socket.gethostname()}:{self._rendezvous_store.port}",
                               "global_rank": 0})

    group = NightlyGroup()
    handle = json.loads(_loopback_handle(NightlyGroup.get_reconfigure_handle)(group))
    port = group._rendezvous_store.port
    assert handle == {"id": "g0", "store": f"127.0.0.1:{port}", "global_rank": 0}
    assert {a for a in own_listeners(psutil.Process()) if a[1] == port} == {("127.0.0.1", port)}
