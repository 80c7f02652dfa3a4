"""Our command lines end without the interpreter's final collections walking torch's objects
(rundir/arguments.py `end_without_collecting`), and merely importing the trainer, as the harness's
command line does, no longer imports torch._dynamo."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Registered before the entry point runs, so it runs after the entry point's own exit handler.
OBSERVE = "import atexit, gc; atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0)); "


@pytest.mark.parametrize("call", [
    "from trainwreck.harness.cli import main; main(['scenarios'])",
    "from trainwreck.trainer.__main__ import main; main(['--run-dir', '/nonexistent/x', '--total-steps', '0'])",
    "from trainwreck.harness.launch.rank import main\ntry: main([])\nexcept SystemExit: pass",
], ids=["trainwreck", "python -m trainwreck.trainer", "python -m trainwreck.harness.launch.rank"])
def test_each_command_line_freezes_the_heap_after_every_other_exit_handler(call: str) -> None:
    done = subprocess.run([sys.executable, "-c", OBSERVE + call], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "frozen at exit: True", done.stdout + done.stderr


LAZY = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.checkpoint", "torch.distributed.tensor")
"""2.5 s and 1.5 s of imports here that only a training rank needs."""


def test_a_process_that_only_imports_the_trainer_imports_neither_dynamo_nor_fsdp_nor_dcp() -> None:
    code = ("import sys, trainwreck.trainer.entry, trainwreck.harness.supervise.supervisor, "
            f"trainwreck.harness.commands.run; print([m for m in {LAZY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_fork_server_still_holds_what_the_trainer_imports_lazily() -> None:
    from trainwreck.harness.launch.rank import WARM_MODULES
    assert set(LAZY) - {"torch.distributed.tensor"} <= set(WARM_MODULES)  # fsdp imports the tensor package


def test_a_usage_error_of_the_standalone_trainer_never_imports_torch() -> None:
    code = ("import sys\nfrom trainwreck.trainer.__main__ import main\n"
            "code = main(['--run-dir', '/nonexistent/run', '--tiny', '--set', 'keep_last=1'])\n"
            "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2 False", done.stdout + done.stderr


@pytest.mark.parametrize("argv", [["run", "--cmd", "python t.py", "--set", "width=8"],
                                  ["run", "--plan", "[1]"], ["run", "--fresh-golden"],
                                  ["run", "--hang-timeout", "inf"], ["run", "--world-sizes", "0,-1"],
                                  ["run", "--total-steps", "-5"], ["run", "--set", "width=2000000000"]],
                         ids=["cmd", "plan", "golden", "hang-timeout", "world-sizes", "total-steps", "width"])
def test_a_refused_trainwreck_run_exits_2_without_importing_torch(argv: list[str]) -> None:
    code = ("import sys\nfrom trainwreck.harness.cli import main\n"
            f"code = main({argv!r})\nprint(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2 False", done.stdout + done.stderr


@pytest.mark.parametrize("argv", [["run", "--plan", "[]"], ["run", "--cmd", "python train.py"], ["demo"]],
                         ids=["reference", "cmd", "demo"])
def test_a_golden_cache_it_cannot_use_is_refused_before_torch_is_imported(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    code = ("import sys\nfrom trainwreck.harness.cli import main\n"
            f"code = main({[*argv, '--out', str(tmp_path / 'o')]!r})\nprint(code, 'torch' in sys.modules)")
    env = dict(os.environ, TRAINWRECK_GOLDEN_CACHE=str(tmp_path / "file" / "below"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.stdout.strip() == "2 False", done.stdout + done.stderr
    assert "the golden cache" in done.stderr and not (tmp_path / "o").exists()
