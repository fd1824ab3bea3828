"""scripts/prefix_chat_traffic.py on tiny inputs: every arm's tokens are caching off's, the hit rate with
speculation on is the hit rate with it off (the drafter's K/V cached in the same blocks), and hits are real."""

import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prefix_chat_traffic.py"


def test_chat_traffic_keeps_its_hits_under_speculation(capsys):
    main = runpy.run_path(str(SCRIPT))["main"]
    rows = main(["--conversations", "2", "--turns", "2", "--system", "40", "--user", "6", "--answer", "12",
                 "--max-seq-len", "160", "--max-batch", "2", "--block-size", "8", "--vocab", "64"])
    assert len(rows) == 4 and len(capsys.readouterr().out.splitlines()) == 4
    assert all(r["tokens_equal_caching_off"] for r in rows)
    plain, speculative = rows[1], rows[3]
    assert plain["caching"] and speculative["caching"] and speculative["speculation"]
    assert plain["hit_rate"] > 0.5 and abs(speculative["hit_rate"] - plain["hit_rate"]) <= 0.02
    assert speculative["prefill_tokens"] < rows[2]["prefill_tokens"]
