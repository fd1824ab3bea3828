"""The soak's quick form (issue 35): a few hundred mixed requests (`specdec.server.soak.MIX`: completions, chats,
streams read and dropped, plain, guided_choice, a new JSON schema every tenth request, a 400) against the live
demo-pair server; every request answered, the RSS slope reported and a generous bound asserted (a leak of the
kind issue 35 found, +22 MB per 100 requests, fails it). The full form, with numbers: scripts/soak_server.py."""

from __future__ import annotations

import sys
from urllib.parse import urlparse

import pytest

from specdec.server.soak import MIX, run_soak, server_pid

REQUESTS = 200
BOUND_MB_PER_100 = 15.0  # generous: allocator noise on a 2-core CI machine is a few MB per 100


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_quick_soak_answers_everything_and_memory_stays_flat(server):
    pytest.importorskip("xgrammar")
    pid = server_pid(urlparse(server).port)
    assert pid is not None
    result = run_soak(server, pid, requests=REQUESTS, clients=4, sample_every=10, warmup=60)
    bad, dropped = REQUESTS // len(MIX), REQUESTS // len(MIX)
    assert result.statuses == {200: REQUESTS - bad - dropped, 400: bad, 0: dropped}, result.statuses
    print(f"soak: {REQUESTS} requests in {result.seconds:.1f} s, RSS {result.rss_start_mb:.0f} -> "
          f"{result.rss_end_mb:.0f} MB, slope {result.slope_mb_per_100:+.2f} MB / 100 requests")
    assert result.slope_mb_per_100 < BOUND_MB_PER_100
