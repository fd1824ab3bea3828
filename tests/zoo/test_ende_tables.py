"""The EnDe paper-tables run (specdec/bench/ende_tables.py) end to end on CPU, with the tiny preset on
synthetic gettext catalogs: training, BLEU/chrF, Tables 3, 2, 4 and the Markdown section. It lives with the
zoo tests for their `.mo` fixtures. The GPU numbers come from scripts/device_run.sh ende-tables."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specdec.bench.alpha_table import NGramLM
from specdec.bench.ende_tables import (
    DRAFT_NAMES, ENDE_TINY_PRESET, EndeTablesConfig, ende_markdown, prediction_table, run_ende_tables,
    seq2seq_alpha,
)
from specdec.drafters.ngram import NGramDrafter


@pytest.mark.parametrize("fast_path", ["auto", "always"])  # on CPU: the transformers path; the fast one, warmed up
def test_tiny_run_writes_every_table(locale_root, tmp_path, fast_path):
    from specdec.zoo.data import prepare_ende_data

    data = tmp_path / "ende"
    prepare_ende_data(data, locale_roots=[locale_root], vocab_size=300, val_fraction=0.3)
    tiny = replace(ENDE_TINY_PRESET, target_train=replace(ENDE_TINY_PRESET.target_train, steps=12))
    config = EndeTablesConfig(alpha_sentences=8, speed_sentences=2, gammas=(1, 3), max_new_tokens=12,
                              fast_path=fast_path)
    result = run_ende_tables(data, tmp_path / "out", preset=tiny, config=config, device="cpu")
    assert result["table2_path"] == ("fast" if fast_path == "always" else "transformers")

    assert set(result["params"]) == {"target", *DRAFT_NAMES}
    assert {(r["drafter"], r["temperature"]) for r in result["table3"]} == {
        (d, t) for d in ("unigram", "bigram", *DRAFT_NAMES) for t in (0.0, 1.0)}
    assert all(0.0 <= r["alpha"] <= 1.0 and r["positions"] > 0 for r in result["table3"])
    speed = [r for r in result["table2"] if r["drafter"] != "plain"]
    assert len(speed) == 2 * 3 * 2 and all(r["speedup"] > 0 and r["tau"] >= 1.0 for r in speed)
    assert len(result["table4"]) == 2 * 3  # the unigram has no Table 2 runs
    quality = result["quality"]
    assert "bleu" in quality or "pending" in quality
    out = tmp_path / "out"
    assert json.loads((out / "ende_tables.json").read_text())["table3"] == result["table3"]
    assert "Table 4 analog" in (out / "ende_tables.md").read_text()
    rows = [json.loads(line) for line in (out / "translations.jsonl").read_text().splitlines()]
    assert sum(r["set"] == "val" for r in rows) == quality["sentences"] == quality["of"]
    assert sum(r["set"] == "ood" for r in rows) == result["quality_ood"]["sentences"] == 2  # the apt catalog
    assert result["ood_catalogs"] == ["apt.mo"]
    assert "out-of-domain" in (out / "ende_tables.md").read_text()


def test_seq2seq_alpha_matches_unpadded_per_sentence_sums():
    import torch

    from seq2seq_models import make_t5, teacher_forced_logits

    target, draft = make_t5(0, vocab=40), make_t5(1, layers=1, vocab=40)
    gen = torch.Generator().manual_seed(0)
    sources = [torch.randint(2, 40, (n,), generator=gen).tolist() for n in (5, 9, 3, 7)]
    outputs = [torch.randint(2, 40, (n,), generator=gen).tolist() for n in (4, 1, 6, 3)]
    bigram = NGramLM(NGramDrafter(2).fit([[0] + y for y in outputs], 40))
    for t in (0.0, 1.0):
        for drafter in (draft, bigram):
            alpha, n = seq2seq_alpha(target, drafter, sources, outputs, temperature=t, batch_size=3)
            total = 0.0
            for s, y in zip(sources, outputs):
                dec = [0] + y[:-1]
                p_logits = teacher_forced_logits(target, s, dec)
                q_logits = (bigram(torch.tensor([dec])).logits[0] if drafter is bigram
                            else teacher_forced_logits(draft, s, dec))
                if t == 0:
                    total += float((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
                else:
                    total += float(torch.minimum(p_logits.softmax(-1), q_logits.softmax(-1)).sum())
            assert n == sum(len(y) for y in outputs)
            assert alpha == pytest.approx(total / n, abs=1e-5)
    assert seq2seq_alpha(target, target, sources, outputs, temperature=1.0)[0] == pytest.approx(1.0, abs=1e-5)


def test_prediction_table_uses_thm_3_8_and_the_nearest_measured_gamma():
    from specdec.analysis import optimal_gamma, walltime_improvement

    alpha_rows = [{"drafter": "small", "temperature": 0.0, "alpha": 0.8, "positions": 100},
                  {"drafter": "unigram", "temperature": 0.0, "alpha": 0.05, "positions": 100}]
    speed = [{"drafter": "small", "temperature": 0.0, "gamma": g, "speedup": s, "cost_ratio": 0.1, "alpha": 0.8,
              "tau": 2.0, "predicted_speedup": 2.0, "tokens_per_s": 100.0}
             for g, s in ((1, 1.4), (3, 2.0), (5, 1.9), (7, 1.7))]
    (row,) = prediction_table(alpha_rows, speed)
    assert row["predicted_gamma"] == optimal_gamma(0.8, 0.1, max_gamma=7)
    assert row["predicted_speedup"] == pytest.approx(walltime_improvement(0.8, row["predicted_gamma"], 0.1))
    assert row["best_measured_gamma"] == 3 and row["best_measured_speedup"] == 2.0
    assert "predicted" in ende_markdown({"table3": alpha_rows, "table2": speed, "table4": [row], "quality": {}})


def test_quality_line_reports_both_test_sets_and_reads_old_results():
    score = {"bleu": 20.5, "chrf": 50.1, "bleu_signature": "nrefs:1|tok:13a", "sentences": 2000, "of": 5475}
    new = ende_markdown({"quality": score, "quality_ood": {**score, "bleu": 9.0, "sentences": 1078, "of": 1078},
                         "val_set": "in-domain", "ood_catalogs": ["apt.mo"]})
    assert "in-domain test set" in new and "BLEU 20.5, chrF 50.1 (2000 of 5475 sentences)" in new
    assert "out-of-domain (whole catalogs of other programs: apt.mo): BLEU 9.0" in new and "(1078 sentences)" in new
    old = ende_markdown({"quality": {**score, "sentences": 1179, "of": None}, "val_catalogs": ["apt.mo"]})
    assert "on the held-out catalogs (apt.mo): BLEU 20.5, chrF 50.1 (1179 sentences)" in old


def test_translation_samples_are_seeded_counted_and_escaped():
    from specdec.bench.ende_report import translation_samples

    rows = [{"set": "val", "en": f"a|{i}", "hyp": f"h{i}", "ref": f"r{i}"} for i in range(30)]
    rows += [{"set": "ood", "en": f"o{i}", "hyp": "x", "ref": "y"} for i in range(2)]
    text = translation_samples(rows, {"val": 5, "ood": 4}, seed=3)
    assert text == translation_samples(rows, {"val": 5, "ood": 4}, seed=3)
    table = [line for line in text.splitlines() if line.startswith("| in-domain") or line.startswith("| out-of")]
    assert sum(line.startswith("| in-domain") for line in table) == 5
    assert sum(line.startswith("| out-of-domain") for line in table) == 2  # all there are
    assert all("a\\|" in line for line in table if line.startswith("| in-domain"))  # a | would split the cell
