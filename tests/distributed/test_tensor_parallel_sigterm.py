"""SIGTERM under load on 2 gloo ranks (issue 43): whichever process gets it — the launcher (what a supervisor or
Ctrl-C sends), the leader alone or a follower alone — every rank and the launcher are gone within `EXIT_BOUND_S`,
none hung, none left behind.

The ranks run the text API under torchrun with requests in flight on the engine's paged pool (`tp_sigterm_worker`).
torchrun is given a shutdown timeout far beyond the bound, so a rank that outlives its SIGTERM is seen here as
hung, not killed by the launcher's escalation. Negative control: a follower that ignores SIGTERM and the loss of
its leader (`stubborn`) must be reported as hung by the same check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

WORKER = Path(__file__).with_name("tp_sigterm_worker.py")
ROOT = Path(__file__).resolve().parents[2]
READY_S = 180  # loading and the first batch on 2 shared cores
EXIT_BOUND_S = 20  # SIGTERM → every process gone (a liveness bound, not a timing: exits take about a second)
SHUTDOWN_TIMEOUT_S = 300  # torchrun's SIGTERM → SIGKILL escalation: never reached within the bound


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (an exited process waiting to be reaped, a zombie, has stopped running)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _survivors(pids: dict[str, int], bound_s: float) -> list[str]:
    """The names of the processes in `pids` still running after up to `bound_s` seconds (polled)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids.values()):
            return []
        time.sleep(0.2)
    return sorted(name for name, pid in pids.items() if _alive(pid))


def _sigterm_under_load(ckpt: Path, folder: Path, mode: str, target: str) -> tuple[list[str], dict]:
    """Launch the worker in `mode`, wait until requests run on both ranks, SIGTERM `target` ("launcher", "leader"
    or "follower") with the tiny pair in `ckpt` (conftest's); → (the processes still running after EXIT_BOUND_S,
    what rank 0 wrote when ready). Every process is SIGKILLed before returning."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        from test_tensor_parallel import torchrun_command
    finally:
        sys.path.remove(str(WORKER.parent))
    cmd, env = torchrun_command(str(WORKER), str(folder), str(ckpt / "target"), str(ckpt / "draft"), mode,
                                launcher=("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)))
    log = folder / "log.txt"  # (a file, not a pipe: nobody reads a pipe while the ranks run)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pids = {"launcher": proc.pid}
    try:
        deadline = time.monotonic() + READY_S
        while not (folder / "ready").exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks did not start serving"
            time.sleep(0.2)
        pids["leader"] = int((folder / "rank0.pid").read_text())
        pids["follower"] = int((folder / "rank1.pid").read_text())
        ready = json.loads((folder / "ready").read_text())
        os.kill(pids[target], signal.SIGTERM)
        survivors = _survivors(pids, EXIT_BOUND_S)
        if not _alive(proc.pid):
            proc.wait()
        return survivors, ready
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.parametrize("target", ["launcher", "leader", "follower"])
def test_sigterm_under_load_ends_every_rank(ckpt, tmp_path, target):
    survivors, ready = _sigterm_under_load(ckpt, tmp_path, "follow", target)
    assert ready["kv_layout"] == "paged"  # the engine ran on the paged pool
    assert survivors == [], f"still running {EXIT_BOUND_S} s after SIGTERM to the {target}: {survivors}"


def test_a_rank_that_ignores_the_stop_is_seen_hung(ckpt, tmp_path):
    """Negative control: the same check reports a follower that outlives its leader's SIGTERM (the launcher, which
    waits for it, with it)."""
    survivors, _ = _sigterm_under_load(ckpt, tmp_path, "stubborn", "leader")
    assert "follower" in survivors
