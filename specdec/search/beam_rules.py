"""One step of beam search exactly as transformers' `generate(num_beams=w, do_sample=False)` does it.

Pure tensor functions over a batch of P prompts, each with its own generated length t (speculative beam
search advances prompts by different numbers of steps per target pass). Mirrors transformers 5.x
`GenerationMixin._beam_search` (`_get_top_k_continuations`, `_get_running_beams_for_next_iteration`,
`_update_finished_beams`, `_check_early_stop_heuristic`), operation for operation, so ties break alike:

- scores are float32 sums of `log_softmax(logits.float())`; the w running beams start as w copies of the prompt
  with scores [0, −1e9, …] (only the first one expands at the first step);
- each step takes the top K = max(2, 1 + #EOS)·w of the w·V continuations; a continuation *hits a stopping
  criterion* if its new token is an EOS or it reaches max_new_tokens; the best w that do not hit continue;
- continuations among the top w (by rank) that hit are *finished* with score sum / (generated length)^length_penalty
  (EOS counted in the length) and merged into the w best finished hypotheses — unless the prompt can no longer
  improve (early-stop heuristic) or, with early_stopping=True, already has w finished;
- a prompt is done when its heuristic says no running beam can beat its worst finished one
  (early_stopping=False: best running score / t^length_penalty; "never": / max_new_tokens^lp when lp > 0),
  when early_stopping=True and all w slots are finished, or when every continuation hit (max length).
The result per prompt is the w finished hypotheses, best first: transformers' `sequences` with
`num_return_sequences=w` and `sequences_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG = -1.0e9  # transformers' "very large negative" score


@dataclass(frozen=True)
class BeamConfig:
    num_beams: int
    max_new_tokens: int
    eos: tuple[int, ...]
    length_penalty: float = 1.0
    early_stopping: "bool | str" = False

    @property
    def beams_to_keep(self) -> int:
        return max(2, 1 + len(self.eos)) * self.num_beams


@dataclass
class BeamState:
    """Beam search state for P prompts (tensors; `t` generated tokens per prompt).

    running_tokens   [P, w, N]  generated tokens of the running beams (N = max_new_tokens)
    running_scores   [P, w]     float32 sums of log-probabilities
    finished_tokens  [P, w, N]; finished_scores [P, w] (length-normalized); finished_lengths [P, w]
    is_finished      [P, w]     slot holds a real finished hypothesis
    improvable       [P]        transformers' is_early_stop_heuristic_unsatisfied
    done             [P]        the prompt's finished set is final
    t                [P]        tokens generated so far
    """

    running_tokens: torch.Tensor
    running_scores: torch.Tensor
    finished_tokens: torch.Tensor
    finished_scores: torch.Tensor
    finished_lengths: torch.Tensor
    is_finished: torch.Tensor
    improvable: torch.Tensor
    done: torch.Tensor
    t: torch.Tensor

    @classmethod
    def start(cls, num_prompts: int, config: BeamConfig, device) -> "BeamState":
        p, w, n = num_prompts, config.num_beams, max(config.max_new_tokens, 1)
        scores = torch.zeros(p, w, device=device)
        scores[:, 1:] = NEG
        return cls(
            running_tokens=torch.zeros(p, w, n, dtype=torch.long, device=device),
            running_scores=scores,
            finished_tokens=torch.zeros(p, w, n, dtype=torch.long, device=device),
            finished_scores=torch.full((p, w), NEG, device=device),
            finished_lengths=torch.zeros(p, w, dtype=torch.long, device=device),
            is_finished=torch.zeros(p, w, dtype=torch.bool, device=device),
            improvable=torch.ones(p, dtype=torch.bool, device=device),
            done=torch.zeros(p, dtype=torch.bool, device=device) | (config.max_new_tokens == 0),
            t=torch.zeros(p, dtype=torch.long, device=device),
        )

    def select(self, index: torch.Tensor) -> "BeamState":
        return BeamState(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})


def beam_step(state: BeamState, log_probs: torch.Tensor, config: BeamConfig, stepping: torch.Tensor):
    """Advance the prompts where `stepping [P]` by one token. log_probs [P, w, V] at the running beams.

    Returns (new state, parents [P, w], tokens [P, w]): new running beam i = old beam parents[i] + tokens[i].
    Prompts not stepping keep their state (their parents/tokens are meaningless).
    """
    p, w, vocab = log_probs.shape
    k = config.beams_to_keep
    accumulated = (log_probs + state.running_scores[:, :, None]).reshape(p, -1)
    topk_scores, topk_index = torch.topk(accumulated, k=k)
    beam, token = topk_index // vocab, topk_index % vocab
    t = state.t
    eos = torch.tensor(config.eos, dtype=torch.long, device=token.device)
    hits = torch.isin(token, eos) | (t + 1 >= config.max_new_tokens)[:, None]
    candidates = state.running_tokens.gather(1, beam[..., None].expand(-1, -1, state.running_tokens.shape[2])).clone()
    column = t.clamp(max=candidates.shape[2] - 1)[:, None, None].expand(-1, k, 1)
    candidates.scatter_(2, column, token[..., None])

    # running beams for the next step: the best w continuations that did not hit a stopping criterion
    running = topk_scores + hits.to(torch.float32) * NEG
    keep = torch.topk(running, k=w)[1]
    parents, tokens = beam.gather(1, keep), token.gather(1, keep)
    running_scores = running.gather(1, keep)
    running_tokens = candidates.gather(1, keep[..., None].expand(-1, -1, candidates.shape[2]))

    # finished hypotheses: continuations among the top w that hit, length-normalized, merged with the old ones
    top_w = torch.arange(k, device=token.device) < w
    just_finished = hits & top_w[None, :]
    lengths = (t + 1).to(torch.float64) ** config.length_penalty
    finished = topk_scores / lengths.to(torch.float32)[:, None]
    full = state.is_finished.all(-1, keepdim=True) & (config.early_stopping is True)
    finished = finished + full.to(torch.float32) * NEG
    finished = finished + (~state.improvable)[:, None].to(torch.float32) * NEG
    finished = finished + (~just_finished) * NEG
    merged_scores = torch.cat([state.finished_scores, finished], 1)
    best = torch.topk(merged_scores, k=w)[1]
    merged_tokens = torch.cat([state.finished_tokens, candidates], 1)
    merged_lengths = torch.cat([state.finished_lengths, (t + 1)[:, None].expand(-1, k)], 1)
    merged_flags = torch.cat([state.is_finished, just_finished], 1)
    finished_scores = merged_scores.gather(1, best)
    finished_tokens = merged_tokens.gather(1, best[..., None].expand(-1, -1, merged_tokens.shape[2]))
    finished_lengths = merged_lengths.gather(1, best)
    is_finished = merged_flags.gather(1, best)

    # can a running beam still beat the worst finished one?
    new_t = t + 1
    if config.early_stopping == "never" and config.length_penalty > 0.0:
        horizon = torch.full_like(new_t, config.max_new_tokens)
    else:
        horizon = new_t
    best_running = running_scores[:, :1] / (horizon.to(torch.float64) ** config.length_penalty).to(torch.float32)[:, None]
    worst_finished = torch.where(is_finished, finished_scores.min(1, keepdim=True)[0], NEG)
    improvable = state.improvable & (best_running > worst_finished).any(-1)
    done = ~improvable | (is_finished.all(-1) & (config.early_stopping is True)) | hits.all(-1)

    s = stepping

    def pick(new, old):
        return torch.where(s.view(-1, *([1] * (new.dim() - 1))), new, old)

    new_state = BeamState(
        running_tokens=pick(running_tokens, state.running_tokens),
        running_scores=pick(running_scores, state.running_scores),
        finished_tokens=pick(finished_tokens, state.finished_tokens),
        finished_scores=pick(finished_scores, state.finished_scores),
        finished_lengths=pick(finished_lengths, state.finished_lengths),
        is_finished=pick(is_finished, state.is_finished),
        improvable=pick(improvable, state.improvable),
        done=pick(done, state.done),
        t=pick(new_t, t),
    )
    return new_state, parents, tokens
