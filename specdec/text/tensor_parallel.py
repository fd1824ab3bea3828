"""`specdec.load(..., tensor_parallel_size=N)` and `specdec serve --tensor-parallel-size N` under torchrun.

Every rank loads its shard of the target (`specdec.distributed.load_sharded`) and a full drafter, and builds the
same `LLM`. Rank 0 (the leader) serves: its runners are wrapped in `LeaderRunner`, which sends every request,
abort and step to the other ranks (`CommandChannel`) before running it; the followers run `follow(llm)`,
applying the leader's commands to their own engines in the same order, so all ranks step together and commit
the same tokens (an all-reduced logit is the same on every rank). Requests get their seed on the leader, so a
request without one still samples the same tokens everywhere. γ may be "auto" (the default or a request's): the
policy times each step on each rank, and the engine runs rank 0's choice on every rank (`engine.agreement`, one
broadcast a step); so does a draft-length policy as the default (`check_gamma`). One runner serves every γ.

A runner rebuilt after start-up (its step raised) is rebuilt on every rank too: the leader sends ("runner", γ)
first. `LLM.close()` on the leader sends ("stop", …); the followers return from `follow`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from specdec.request import resolve_seed

__all__ = ["LeaderRunner", "follow", "make_runner", "stop_followers", "load_tensor_parallel", "check_gamma"]

logger = logging.getLogger(__name__)


def check_gamma(gamma) -> None:
    """γ under tensor parallelism: an int, "auto" or (the model's default) a draft-length policy — a name or a
    `DraftLengthPolicy` object, built on every rank (each rank runs the same script): each rank's policy is asked
    and told every step, and the engine runs rank 0's choice of γ and row caps on every rank (`engine.agreement`:
    the same broadcast as "auto"'s, in every step with a row that takes the default)."""
    from specdec.policy import POLICY_NAMES, DraftLengthPolicy

    if not (gamma == "auto" or gamma in POLICY_NAMES or isinstance(gamma, DraftLengthPolicy)
            or (isinstance(gamma, int) and not isinstance(gamma, bool))):
        raise ValueError(f"num_draft_tokens={gamma!r}: tensor parallelism runs the engine, which takes an integer "
                         "γ, 'auto' or a draft-length policy")


class LeaderRunner:
    """Rank 0's runner: applies each call to its own engine and logs it; `step` sends the log, then steps."""

    def __init__(self, engine, channel, key):
        self.engine = engine
        self.channel = channel
        self.key = key
        self._log: list[tuple] = []
        self._log_lock = threading.Lock()  # held across a step too: nothing is admitted the followers lack

    def add_request(self, prompt_ids, params, request_id: str | None = None) -> str:
        if params.seed is None:  # the followers must draw with the same seed
            params = dataclasses.replace(params, seed=resolve_seed(None))
        with self._log_lock:
            rid = self.engine.add_request(prompt_ids, params, request_id=request_id)
            self._log.append(("add", list(prompt_ids), params, rid))
        return rid

    def abort(self, request_id: str) -> None:
        with self._log_lock:
            self.engine.abort(request_id)
            self._log.append(("abort", request_id))

    def step(self) -> list:
        with self.channel.lock, self._log_lock:
            commands, self._log = self._log, []
            self.channel.send(("step", self.key, commands))
            return self.engine.step()

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def __getattr__(self, name):  # the engine's read-only surface (num_running, vocab_size, max_seq_len, …)
        return getattr(self.engine, name)


def make_runner(llm, *, announce: bool):
    """`llm`'s runner on this rank: the engine (never the eager loop: it has no sharded path), wrapped in a
    `LeaderRunner` on rank 0. `announce`: tell the followers to make it too (after start-up, where every rank
    makes its first runner by itself)."""
    from specdec.text.prompts import gamma_label

    gamma, channel = gamma_label(llm.num_draft_tokens), llm.tensor_parallel  # (a policy object: by its class's name)
    if llm.runner_choice == "fallback":
        raise ValueError("tensor parallelism runs on the request-level engine (runner='engine' or 'auto')")
    llm.runner_choice = "engine"
    if not channel.is_leader:
        return llm._build_runner()
    with channel.lock:  # the new engine's warm-up all-reduces: no step may interleave
        if announce:
            channel.send(("runner", gamma, None))
        engine = llm._build_runner()
    return LeaderRunner(engine, channel, gamma)


def stop_followers(llm) -> None:
    """Rank 0, once its driver has stopped: release the followers from `follow`, then leave the group with them
    (`shutdown_tensor_parallel`). Idempotent."""
    from specdec.distributed import shutdown_tensor_parallel

    channel = llm.tensor_parallel
    with channel.lock:
        if channel.stopped:
            return
        channel.stopped = True
        try:
            channel.send(("stop", None, None))
        except Exception:  # noqa: BLE001 - a follower already gone (killed by the launcher): leave anyway
            logger.warning("tensor parallel: could not reach every follower to stop it", exc_info=True)
    shutdown_tensor_parallel(llm.target, timeout_s=15.0)


def load_tensor_parallel(target, tensor_parallel_size: int, *, device, dtype, make_llm, all_reduce: str = "auto"):
    """Every rank: join torchrun's group, load this rank's shard of `target` (a local safetensors folder) and
    build the LLM with `make_llm(target_model, channel)`. Rank 0 gets the LLM back; the other ranks follow rank 0
    until it closes the LLM, then leave the group and exit the process (`SystemExit(0)`), as vLLM's workers do."""
    from pathlib import Path

    from specdec.distributed import init_tensor_parallel, load_sharded, shutdown_tensor_parallel
    from specdec.distributed.channel import CommandChannel
    from specdec.loading import resolve_device, resolve_dtype

    if not isinstance(target, (str, Path)):
        raise ValueError("tensor_parallel_size > 1 loads the target from a local safetensors folder (each rank "
                         "reads only its slices); got a model object")
    rank_device = init_tensor_parallel(tensor_parallel_size, resolve_device(device))
    model = None
    try:
        model = load_sharded(target, device=rank_device, dtype=resolve_dtype(dtype, rank_device), all_reduce=all_reduce)
        channel = CommandChannel()
        llm = make_llm(model, channel)
    except BaseException:
        shutdown_tensor_parallel(*(m for m in (model,) if m is not None))
        raise
    if channel.is_leader:
        return llm
    steps = follow(llm)
    logger.info("tensor parallel rank %d: followed %d steps; leaving", channel.rank, steps)
    llm.driver.close()
    shutdown_tensor_parallel(model)
    raise SystemExit(0)


def follow(llm) -> int:
    """Ranks other than 0: apply the leader's commands until it stops; returns the number of steps run."""
    channel = llm.tensor_parallel
    steps = 0
    while True:
        kind, key, payload = channel.receive()
        if kind == "stop":
            return steps
        if kind == "runner":  # the leader rebuilt its runner: so does this rank
            llm.driver.failed.add(llm.runner())
        runner = llm.runner()
        if kind == "step":
            for command in payload:
                if command[0] == "add":
                    _, prompt, params, rid = command
                    runner.add_request(prompt, params, request_id=rid)
                else:
                    runner.abort(command[1])
            runner.step()
            steps += 1
