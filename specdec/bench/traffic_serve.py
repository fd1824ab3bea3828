"""The traffic benchmark through `specdec serve`: the same kind of requests as `specdec.bench.traffic` (prompts
cut from the held-in code prompts, mixed budgets, greedy and sampled, the model's EOS on), sent by streaming
clients (`specdec.server.bench.run_traffic_level`) to a server started here. Each level is a closed loop of C
clients (`requests_per_client` requests each), then, for each Poisson arrival of the spec, all the requests
arriving at that rate ("poisson:Fx": F × plain's completion rate at the largest closed level): plain requests
(num_draft_tokens 0) and speculative ones (the server's --num-draft-tokens, "auto" by default) on the same
server, the same requests, one level after the other.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from specdec.bench.traffic import TrafficSpec, make_requests

__all__ = ["serve_traffic", "serve_table"]


def serve_traffic(target: Path, draft, pool: list[list[int]], spec: TrafficSpec, clients=(8, 32, 64, 128), *,
                  requests_per_client: int = 2, num_draft_tokens="auto", device: str = "cuda", dtype: str = "bfloat16",
                  log=None, max_seconds: float | None = None, server_args: tuple[str, ...] = ()) -> dict:
    """Start `specdec serve --target TARGET --draft DRAFT` (and `server_args`) and run every level on requests cut
    from `pool` (token ids) → {"server_log", "levels": [LevelResult dicts with vs_plain and itl_p99_vs_plain],
    "markdown"}."""
    from specdec.engine.config import BATCH_BUCKETS
    from specdec.server.bench import ServerProcess, markdown_table, run_traffic_level

    config = json.loads((Path(target) / "config.json").read_text())
    context = min(int(config.get("max_position_embeddings") or 4096), 4096)
    requests = make_requests(pool, max(clients) * requests_per_client, spec, (), spec.seed, max_total=context)
    bodies = [{"prompt": r.prompt, "max_tokens": r.params.max_new_tokens, "temperature": r.params.temperature,
               "seed": r.params.seed} for r in requests]
    batch = min(max(clients), BATCH_BUCKETS[-1])  # (the engine's largest batch; more clients queue)
    args = ["--target", str(target), "--draft", str(draft), "--num-draft-tokens", str(num_draft_tokens),
            "--max-batch-size", str(batch), "--device", device, "--dtype", dtype, *server_args]
    start, results = time.perf_counter(), []
    server = ServerProcess(args, start_timeout_s=400)
    with server as url:
        if log:
            log(f"serve: server ready in {time.perf_counter() - start:.0f} s ({url}); drafter {draft}")
        for mode in ("plain", "speculative"):  # untimed: the first requests of each runner
            asyncio.run(run_traffic_level(url, bodies[:2], mode=mode, clients=1))
        begun = time.perf_counter()
        for c in clients:
            if max_seconds is not None and time.perf_counter() - begun > max_seconds:
                break
            level = bodies[: c * requests_per_client]
            pair_rows = [asyncio.run(run_traffic_level(url, level, mode=mode, clients=c)) for mode in ("plain", "speculative")]
            plain, spec_row = pair_rows
            for row in pair_rows:
                item = row.to_dict()
                item["vs_plain"] = row.throughput_tok_s / plain.throughput_tok_s if plain.throughput_tok_s else None
                item["itl_p99_vs_plain"] = row.itl_p99_s / plain.itl_p99_s if plain.itl_p99_s else None
                results.append(item)
            if log:
                log(f"serve: {c} clients: speculative {spec_row.throughput_tok_s:.0f} tok/s = "
                    f"{results[-1]['vs_plain']:.2f}x plain; ITL p99 {1e3 * spec_row.itl_p99_s:.1f} ms vs "
                    f"{1e3 * plain.itl_p99_s:.1f} ms")
        capacity = results[-2]["requests"] / results[-2]["duration_s"] if len(results) >= 2 else None
        for arrival in [a for a in spec.arrivals if a.kind == "poisson"]:
            if (max_seconds is not None and time.perf_counter() - begun > max_seconds) or (
                    arrival.relative is not None and not capacity):
                break
            rate = arrival.rate if arrival.relative is None else arrival.relative * capacity
            pair_rows = [asyncio.run(run_traffic_level(url, bodies, mode=mode, rate=rate, seed=spec.seed))
                         for mode in ("plain", "speculative")]
            for row in pair_rows:
                item = row.to_dict()
                item["vs_plain"] = row.throughput_tok_s / pair_rows[0].throughput_tok_s
                item["itl_p99_vs_plain"] = row.itl_p99_s / pair_rows[0].itl_p99_s if pair_rows[0].itl_p99_s else None
                results.append(item)
            if log:
                log(f"serve: {arrival.label} ({rate:.2f} requests/s): speculative {results[-1]['vs_plain']:.2f}x plain")
    from specdec.server.bench import LevelResult

    levels = [LevelResult(**{k: v for k, v in r.items() if k not in ("vs_plain", "itl_p99_vs_plain")}) for r in results]
    return {"server_log": server.log_lines, "target": str(target), "drafter": str(draft),
            "num_draft_tokens": str(num_draft_tokens),
            "requests_per_client": requests_per_client, "levels": results,
            "markdown": markdown_table(levels) + "\n\n" + serve_table(results)}


def serve_table(levels: list[dict]) -> str:
    """Speculative over plain per level: throughput and ITL p99."""
    lines = ["| arrival | plain tok/s | speculative tok/s | speculative / plain | ITL p99 plain / spec. (ms) | τ |",
             "|---|---|---|---|---|---|"]
    plain = {r["arrival"]: r for r in levels if r["mode"] == "plain"}
    for r in levels:
        if r["mode"] != "speculative" or r["arrival"] not in plain:
            continue
        p = plain[r["arrival"]]
        tau = "–" if r["accepted_per_step"] is None else f"{r['accepted_per_step']:.2f}"
        lines.append(f"| {r['arrival']} | {p['throughput_tok_s']:.0f} | {r['throughput_tok_s']:.0f} | "
                     f"{r['vs_plain']:.2f}x | {1e3 * p['itl_p99_s']:.1f} / {1e3 * r['itl_p99_s']:.1f} | {tau} |")
    return "\n".join(lines)
