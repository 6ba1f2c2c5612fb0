"""Simulator token bytes for SentencePiece vocabularies (Gemma): ``▁`` = space, ``<0xNN>`` = byte NN.

The GPT-2 byte map once turned Gemma's ``é`` into byte 0xE9 and byte-fallback tokens into the literal
text ``<0x0A>``, so the auditor (``probes.align.ByteVocab``) mapped the simulator's tokens and
alternatives onto other reference ids. The two byte tables must agree id for id.
"""

from __future__ import annotations

from probes.align import ByteVocab
from simulator.engine import build_vocab_bytes


class _SpmTok:
    """Minimal SentencePiece-style tokenizer: the methods build_vocab_bytes and ByteVocab call."""

    def __init__(self) -> None:
        self.pieces = ["<pad>", "<eos>", "<bos>", "<0x0A>", "<0xC3>", "<0xZZ>", "\u2581a", "a", "\u2581Caf\u00e9",
                       "\u00e9n\u00e9", "h\u00f4tel", "\u2581", "\n\n", "aln\u0131z", "\u0120x"]
        self.all_special_ids = [0, 1, 2]
        self.all_special_tokens = ["<pad>", "<eos>", "<bos>"]
        self.added_tokens_decoder: dict = {}

    def __len__(self) -> int:
        return len(self.pieces)

    def get_vocab(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.pieces)}

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids] if isinstance(ids, list) else self.pieces[ids]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert text == " a\n"
        return [6, 3]

    def decode(self, ids) -> str:
        raise AssertionError("SentencePiece tokens must not go through decode()")


def test_spm_bytes_match_auditor_byte_vocab():
    tok = _SpmTok()
    sim = build_vocab_bytes(tok)
    bv = ByteVocab.from_tokenizer(tok)
    assert bv.mode == "spm"
    assert sim[3] == b"\n" and sim[4] == b"\xc3" and sim[6] == b" a" and sim[11] == b" "
    assert sim[8] == " Caf\u00e9".encode() and sim[9] == "\u00e9n\u00e9".encode()
    assert sim[14] == "\u0120x".encode()  # a GPT-2-looking character in an SPM vocab stays text
    for i, b in bv.id_bytes.items():
        assert sim[i] == b, (i, tok.pieces[i], sim[i], b)
