"""Chunked prefill interleaved with decode steps (`EngineConfig.prefill_budget`; mixed into `Engine`).

With a budget, a request admitted while others run does not prefill at admission: it takes a free slot past the
running ones and is *filling* there (`_filling`, oldest first) — its row's state is written but inactive, so the
decode steps over the running rows leave it alone. Each `step()` first runs `_prefill_step`: at most
`prefill_budget` prompt tokens, the target's and a cached drafter's feeds together, oldest request first (each
request's target prefill, then the drafter's feed of the same prompt, which reads the target's features), in
batched forwards over groups of consecutive fed slots (`_groups`; the target's ragged, `slots.prefill_ragged`);
a request whose prompt is fully fed is *ready*: it moves into slot
n (the first past the running ones; a younger filling request there swaps into its slot) and joins the decode
steps. So between two decode steps of a running request the engine prefills at most one budget, and the
budgeted phase is timed apart from the step, as admission is (the γ policy sees each feed's seconds:
`policy_admission.AdmissionCost.prefilled`). The budget is a fixed number of tokens or "auto" (`prefill_budget.py`:
a fraction of the measured decode step, at the measured prefill rate); with `prefill_steps` K (4 with "auto") a step
feeds more when the backlog needs it, so every request is fed within K steps of its admission (`_step_budget`).

Invariants: running requests hold slots 0..n-1 (as without a budget); filling requests hold slots ≥ n, in any
order, below the beam groups' (`beam.py` counts them as chain rows). An inactive filling row inside a step's batch bucket is padding: the step writes its target cache at
positions ≥ its prompt length − 1 and its drafter's at ≥ length − WINDOW (the state holds its prompt length),
which its first own step rewrites before anything reads them, and prefill only ever attends below them.
Exactness: a chunk feeds the same positions with the same tokens as an admission prefill would, so a request's
tokens are the same with or without a budget (tests/engine/test_chunked_prefill.py).
"""

from __future__ import annotations

import time

import torch

from specdec.engine.admission import EngineRequest
from specdec.engine.prefill_budget import DEFAULT_STALL, DEFAULT_STEPS, AutoBudget
from specdec.engine.slots import positions_bucket, prefill_ragged, prefill_rows

__all__ = ["ChunkedPrefill"]


class ChunkedPrefill:
    """`Engine`'s budgeted prefill of filling requests (see the module doc)."""

    def _init_prefill(self, config) -> None:
        """The budget: an int, "auto" (`engine.prefill_budget`: measured) or None (off), and the deadline K."""
        self.prefill_budget = config.prefill_budget or None
        auto = self.prefill_budget == "auto"
        self._auto_budget = AutoBudget(config.prefill_stall or DEFAULT_STALL) if auto else None
        self._prefill_steps = config.prefill_steps or (DEFAULT_STEPS if auto else None)
        self._filling: list[EngineRequest] = []  # admitted, prompt not fed yet, oldest first
        if self.prefill_budget and config.admit_min is None:  # (grouping admissions saves launches of whole
            self.admit_min = 1  # prefills; chunked feeds batch the filling rows anyway: a group only delays them)

    @property
    def step_prefill_budget(self) -> int | None:
        """The prompt tokens the next step may prefill before its deadlines (`prefill_steps`) ask for more: the fixed
        budget, or "auto"'s from the measured decode step and prefill rate (None: chunked prefill is off)."""
        if self._auto_budget is not None:
            return self._auto_budget.budget()
        return self.prefill_budget

    @property
    def prefill_report(self) -> dict | None:
        """JSON-ready: "auto"'s measurements and budget now (None unless prefill_budget="auto")."""
        return None if self._auto_budget is None else self._auto_budget.report()

    def _measure_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill fed `tokens` prompt tokens (target and drafter) in `seconds` ("auto" sizes the budget from it)."""
        if self._auto_budget is not None:
            self._auto_budget.fed(tokens, seconds)

    def _decoded(self, seconds: float) -> None:
        """A decode step took `seconds` ("auto" sizes the budget from it)."""
        if self._auto_budget is not None:
            self._auto_budget.decoded(seconds)

    def _place(self, admitted: list[EngineRequest]) -> None:
        """Admitted requests take free slots past the running ones, highest first, and start filling: a filling row
        inside the decode step's batch bucket is padding whose prompt the step's positions span must cover (a
        2,000-token prompt filling beside short rows would double the span, so every decode step's attention,
        while it fills); from the top they stay outside the bucket while a slot there is free. Ready, a request
        moves down into slot n (`_ready`: one copy of its cache)."""
        taken = {r.slot for r in self._filling}  # (below the slots beam groups hold: `beam._chain_limit`)
        free = (s for s in range(self._chain_limit() - 1, len(self._running) - 1, -1) if s not in taken)
        for request in admitted:
            request.slot = next(free)
            self.state.admit_rows(request.slot, [request.prompt], [request.params], [request.seed])
            self.state.active[request.slot] = False  # not a row of the decode steps until it is ready
            self._resume(request.slot, request)  # (its blocks, paged; a preempted request's generated count)
            request.prefilled = request.draft_valid = request.num_cached_tokens  # (0, or a prefix cache's hit)
            request.fed_by = self._num_steps + (self._prefill_steps or 0)  # (this step counts: `_step_budget`)
            self._filling.append(request)

    def _prefill_step(self) -> bool:
        """Feed at most one budget of the filling requests' prompts (oldest first); the ones fully fed join the
        running rows. → whether anything was fed."""
        # with nothing running no decode step waits: everything filling is fed at once
        budget, target, drafter = self._step_budget() if self._running else 1 << 62, {}, {}
        for request in self._filling:
            if budget <= 0:
                break
            end = len(request.prompt) - 1  # the target is fed all but the last prompt token
            if request.prefilled < end:
                take = min(end - request.prefilled, budget)
                target[request.slot] = (request.prefilled, request.prefilled + take)
                request.prefilled += take
                budget -= take
            end = max(len(request.prompt) - 2, 0)  # a cached drafter all but the last two (as at admission)
            if self.drafter_cached and request.prefilled == len(request.prompt) - 1 and request.draft_valid < end \
                    and budget > 0:
                take = min(end - request.draft_valid, budget)
                drafter[request.slot] = (request.draft_valid, request.draft_valid + take)
                request.draft_valid += take
                budget -= take
        cuda = self.device.type == "cuda"
        start = time.perf_counter()
        if target:
            for rows, starts, ends in self._groups(target, ragged=True):
                prefill_ragged(self.model, self.cache, self.state, rows, starts, ends, self.config.prefill_chunk,
                               features=self.state.features)
            if cuda:  # (timed apart: the drafter's share of the same prompts' cost, for the policy)
                torch.cuda.synchronize(self.device)
        middle = time.perf_counter()
        if drafter:
            ragged = getattr(self.drafter, "prefill_ragged", None)  # (the engine's model drafter and heads)
            for rows, starts, ends in self._groups(drafter, ragged=ragged is not None):
                (ragged or self.drafter.prefill)(self.state, rows, starts, ends, self.config.prefill_chunk, extent=0)
            if cuda:
                torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        fed_target = sum(e - s for s, e in target.values())
        fed_drafter = sum(e - s for s, e in drafter.values())
        self.prefill_tokens += fed_target + fed_drafter
        self._measure_prefill(fed_target + fed_drafter, seconds)
        ready = []
        for request in list(self._filling):
            if target.get(request.slot) or drafter.get(request.slot):
                request.stats.add_prefill(seconds, 1 if request.slot in target else 0)
            if request.prefilled == len(request.prompt) - 1 and (
                    not self.drafter_cached or request.draft_valid >= len(request.prompt) - 2):
                ready.append(request)
        for request in ready:
            self._ready(request)
        self.policy.admission.prefilled(fed_target, middle - start, fed_drafter,
                                        time.perf_counter() - middle if drafter else None, len(ready),
                                        sum(len(r.prompt) for r in ready))
        return bool(target or drafter)

    def _step_budget(self) -> int:
        """This step's budget: `prefill_budget`, or with `prefill_steps` K more where the backlog needs it, so every
        filling request is fed within K steps of its admission — fed oldest first, request i (its own and the older
        requests' unfed tokens C_i, d_i steps left to its deadline) needs ⌈C_i / d_i⌉ this step."""
        budget, steps = self.step_prefill_budget, self._prefill_steps
        if not steps:
            return budget
        backlog = 0
        for r in self._filling:
            backlog += len(r.prompt) - 1 - r.prefilled
            if self.drafter_cached:
                backlog += max(len(r.prompt) - 2, 0) - r.draft_valid
            budget = max(budget, -(-backlog // max(r.fed_by - self._num_steps, 1)))
        return budget

    def _groups(self, fed: dict[int, tuple[int, int]], ragged: bool = False) -> list[tuple[slice, list[int], list[int]]]:
        """The batched feeds of the slots in `fed` ({slot: (start, end)}): (rows, starts, ends) per forward group.

        A forward runs every row of its slice: over the chunk columns [min start, max end) of all of them
        (`prefill_rows`: one feed for every filling row computed rows × columns, not tokens — 30 rows filling at
        different offsets, 2 of them fed a budget, cost 15x the tokens fed), or over the longest feed from each
        row's own start (`ragged`: `prefill_ragged`, the target's feeds). So a group holds only slots fed now,
        consecutive, and a slot joins the previous group only while that costs fewer token slots than a forward of
        its own (`prefill_chunk` slots: a forward's launches, in tokens, roughly)."""
        cost = _ragged if ragged else _rectangle
        groups: list[list[int]] = []
        for slot in sorted(fed):
            group = groups[-1] if groups and groups[-1][-1] == slot - 1 else None
            if group is not None:
                merged = cost([fed[s] for s in group + [slot]])
                apart = cost([fed[s] for s in group]) + cost([fed[slot]])
                if merged <= apart + self.config.prefill_chunk:
                    group.append(slot)
                    continue
            groups.append([slot])
        return [(slice(g[0], g[-1] + 1), [fed[s][0] for s in g], [fed[s][1] for s in g]) for g in groups]

    def _ready(self, request: EngineRequest) -> None:
        """A filling request's prompt is fed: it moves into slot n and joins the decode steps."""
        self._filling.remove(request)
        slot, n = request.slot, len(self._running)
        if slot != n:
            other = next((r for r in self._filling if r.slot == n), None)
            positions = positions_bucket(len(request.prompt) + 1, self.num_positions)
            if other is None:  # (the usual case: slot n is free)
                self._move_slot(slot, n, positions)
                self.state.clear(slot)
            else:  # a younger request fills slot n: the two exchange slots
                positions = max(positions, positions_bucket(len(other.prompt) + 1, self.num_positions))
                self._swap_slots(slot, n, positions)
                other.slot = slot
        self.state.active[n] = True
        request.slot = n
        self._running.append(request)
        self._joined(request)


def _rectangle(bounds: list[tuple[int, int]]) -> int:
    """Token slots one forward over these rows computes: rows × (the last end − the first start)."""
    return len(bounds) * (max(e for _, e in bounds) - min(s for s, _ in bounds))


def _ragged(bounds: list[tuple[int, int]]) -> int:
    """Token slots one ragged forward over these rows computes: rows × the longest feed."""
    return len(bounds) * max(e - s for s, e in bounds)
