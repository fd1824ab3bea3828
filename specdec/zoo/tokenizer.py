"""Byte-level BPE tokenizers (Hugging Face `tokenizers`), shared by a target and its drafters.

Saved as a `PreTrainedTokenizerFast` folder (tokenizer.json + tokenizer_config.json + special tokens),
so `transformers.AutoTokenizer.from_pretrained(folder)` loads it like any user checkpoint's tokenizer.
Special tokens have fixed ids: 0 `<pad>` (also T5's decoder start), 1 `<s>`, 2 `</s>`.
Byte-level means every string round-trips exactly: no unknown token, whitespace and newlines kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS)  # ids 0, 1, 2


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    append_eos: bool = False,
    min_frequency: int = 2,
    model_max_length: int = 2048,
):
    """Train a byte-level BPE on `texts`; returns a `transformers.PreTrainedTokenizerFast`.

    append_eos: encoding adds `</s>` after each text (what T5 encoders expect); decoder-only LMs leave it
    off and put `</s>` between documents themselves.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    count = 0

    def counted() -> Iterator[str]:
        nonlocal count
        for text in texts:
            count += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if count == 0:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    eos_id = tok.token_to_id(EOS)
    if append_eos:
        tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}",
                                                           special_tokens=[(EOS, eos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    logger.info("trained byte-level BPE: %d tokens from %d texts", len(fast), count)
    return fast


def load_tokenizer(folder: str | os.PathLike):
    """`AutoTokenizer.from_pretrained` on a local folder, with a clear error when it is missing."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
