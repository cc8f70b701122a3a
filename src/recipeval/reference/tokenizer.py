"""A byte-level tokenizer built locally with the `tokenizers` package: three special tokens and
one token per byte, so any text round-trips and nothing is downloaded."""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIALS = (PAD, BOS, EOS)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TOKENIZER_SIZE = len(SPECIALS) + 256


@lru_cache(maxsize=1)
def byte_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*SPECIALS, *alphabet])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    assert tokenizer.get_vocab_size() == TOKENIZER_SIZE
    return tokenizer


def encode(text: str) -> list[int]:
    return byte_tokenizer().encode(text).ids


def decode_until_eos(ids: list[int]) -> str:
    """The response text a reward sees: everything before the first EOS, pads dropped."""
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return byte_tokenizer().decode([i for i in ids if i >= len(SPECIALS)])
