"""The maps file: token-level maps (:class:`~attnlab.maps.tokens.AttentionMaps`) in one NumPy ``.npz``.

An archive read with ``allow_pickle=False``: one ``header`` array holding UTF-8 JSON, and one array
per sentence of each array of each record, named ``<record>.<array>.<i>`` (``self_attention.weights.0``,
``cross.queries.2``), exactly as captured or converted (float32 or float16 weights). The header
(version 2) holds the format name and version, model id, revision, config, sentences, the sides
(``source``, and an encoder–decoder's ``target``: tokens, token-to-word index, words and kinds) and
per record its sides by name, its layer and head counts, its per-layer facts (or null) and the names
of the arrays it holds. Saving and loading are lossless: the arrays come back bit for bit, the rest equal.

Version 3 is a long input's maps (:class:`~attnlab.maps.long.LongMaps`: no weights, one sentence):
the header names its sentence, sides, model, per-layer facts, sink and length, and the arrays are
``long.queries`` [L, H, T, D], ``long.keys`` [L, H_kv, T, D] and ``long.lse`` [L, H, T] (and ``long.sink_logits``
[L, H] where the model has learned sinks).

Version 4 is version 2 with learned sinks (gpt-oss): a record of such a model also holds
``<record>.sink_share.<i>`` [L, H, Tq], each row's share of the sink (its weights add up to 1 minus it),
named among the record's arrays. Maps without sinks are still written as version 2, so that every reader
of version 2 reads them; a file with sink shares is version 4, which a reader of version 2 refuses
instead of showing rows that do not add up to 1 as if they did.

Version 1 (the flat record: ``weights_<i>``, ``queries_<i>``, ``cross_<i>``, ``decoder.weights_<i>``, …,
``qk_meta`` and ``cross_qk_meta`` in the header) is still read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.maps.records import Attention, LayerFacts, Maps, Tokens

FORMAT = "attnlab.maps"
FORMAT_VERSION = 2
LONG_VERSION = 3  # a long input's maps: queries, keys and row LSEs, no weights
SINK_VERSION = 4  # version 2 with each row's sink share (models with learned sinks)
READS = (1, 2, LONG_VERSION, SINK_VERSION)  # the versions load_maps reads
LONG_ARRAYS = ("queries", "keys", "lse")
LONG_OPTIONAL = ("sink_logits",)  # [L, H] learned sinks, where the model has them
# Which side each record is over: (query side, key side).
SIDES = {"self_attention": ("source", "source"), "decoder": ("target", "target"), "cross": ("target", "source")}


def _tokens_header(side: Tokens) -> dict:
    return {"tokens": side.tokens, "word_of": side.word_of, "words": side.words, "kinds": side.kinds}


def _header(maps: Maps, config: dict) -> dict:
    sides = {"source": _tokens_header(maps.source)}
    if maps.target is not None:
        sides["target"] = _tokens_header(maps.target)
    records = {}
    for name, rec in maps.attentions():
        query, key = SIDES[name]
        records[name] = {
            "query_side": query, "key_side": key, "num_layers": rec.num_layers, "num_heads": rec.num_heads,
            "layers": None if rec.layers is None else [f.to_dict() for f in rec.layers],
            "arrays": list(rec.arrays()),
        }
    sinks = any(rec.has_sinks for _, rec in maps.attentions())
    return {
        "format": FORMAT, "version": SINK_VERSION if sinks else FORMAT_VERSION, "model_id": maps.model_id, "revision": maps.revision,
        "config": config, "sentences": [s if isinstance(s, str) else list(s) for s in maps.sentences],
        "sides": sides, "attentions": records,
    }


def write(maps: Maps, config: dict, path: str | os.PathLike) -> Path:
    """Write token-level ``maps`` and the model's ``config`` to ``path`` (``.npz`` is appended when
    missing); returns the path written."""
    if maps.level != "token":
        raise TypeError(f"maps must be token-level (capture()'s), got {maps.level}-level {type(maps).__name__}")
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    arrays = {f"{name}.{kind}.{i}": x for name, rec in maps.attentions()
              for kind, xs in rec.arrays().items() for i, x in enumerate(xs)}
    arrays["header"] = np.frombuffer(json.dumps(_header(maps, config), ensure_ascii=False).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def write_long(long: Any, path: str | os.PathLike) -> Path:
    """Write a :class:`~attnlab.maps.long.LongMaps` to ``path`` (``.npz`` appended when missing), version 3."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    header = {"format": FORMAT, "version": LONG_VERSION, **long.to_fields(), "sides": {"source": _tokens_header(long.side)}}
    arrays = {f"long.{name}": getattr(long, name) for name in LONG_ARRAYS + LONG_OPTIONAL
              if getattr(long, name) is not None}
    arrays["header"] = np.frombuffer(json.dumps(header, ensure_ascii=False).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def read(path: str | os.PathLike) -> dict:
    """What a maps file of version 1, 2 or 4 holds, as the fields of
    :class:`~attnlab.maps.tokens.AttentionMaps` (sentences, the records, model id, revision, config);
    of version 3, the fields of :class:`~attnlab.maps.long.LongMaps` (``level`` "long" says which)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"maps file {str(path)!r} does not exist")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"maps file {str(path)!r} is not an attnlab .npz maps file ({e})") from None
    with archive:
        if "header" not in archive.files:
            raise ValueError(f"maps file {str(path)!r} has no header; it was not written by attnlab")
        header = json.loads(archive["header"].tobytes().decode())
        version = header.get("version")
        if header.get("format") != FORMAT or version not in READS:
            raise ValueError(
                f"maps file {str(path)!r} is format {header.get('format')!r} version {version!r}; "
                f"expected {FORMAT!r} version {' or '.join(map(str, READS))}"
            )
        if version == LONG_VERSION:
            return _read_long(header, archive)
        return _read_v1(header, archive) if version == 1 else _read_v2(header, archive)


def _read_long(header: dict, archive: Any) -> dict:
    fields = {k: header[k] for k in ("sentence", "model_id", "revision", "config", "sink", "length")}
    return {"level": "long", **fields, "side": _tokens(header["sides"]["source"]),
            "layers": tuple(LayerFacts(**f) for f in header["layers"]),
            **{name: archive[f"long.{name}"] for name in LONG_ARRAYS},
            **{name: archive[f"long.{name}"] for name in LONG_OPTIONAL if f"long.{name}" in archive.files}}


def _tokens(part: dict) -> Tokens:
    return Tokens(tokens=part["tokens"], word_of=part["word_of"], words=part["words"], kinds=part["kinds"])


def _fields(header: dict, own: Attention, decoder: Attention | None, cross: Attention | None) -> dict:
    return {"sentences": [s if isinstance(s, str) else tuple(s) for s in header["sentences"]], "self_attention": own,
            "decoder": decoder, "cross": cross, "model_id": header["model_id"], "revision": header["revision"],
            "config": header["config"]}


def _read_v2(header: dict, archive: Any) -> dict:
    """Version 2, and version 4 (the same, with sink shares among a record's arrays)."""
    n = len(header["sentences"])
    sides = {name: _tokens(part) for name, part in header["sides"].items()}
    records = {}
    for name, rec in header["attentions"].items():
        got = {kind: [archive[f"{name}.{kind}.{i}"] for i in range(n)] for kind in rec["arrays"]}
        layers = None if rec["layers"] is None else tuple(LayerFacts(**f) for f in rec["layers"])
        records[name] = Attention(
            weights=got["weights"], query_side=sides[rec["query_side"]], key_side=sides[rec["key_side"]],
            num_layers=rec["num_layers"], num_heads=rec["num_heads"], queries=got.get("queries"),
            keys=got.get("keys"), position_bias=got.get("position_bias"), layers=layers,
            sink_share=got.get("sink_share"),
        )
    return _fields(header, records["self_attention"], records.get("decoder"), records.get("cross"))


def _facts(meta: dict | None, num_layers: int) -> tuple[LayerFacts, ...] | None:
    """Version 1's ``qk_meta`` (per layer lists of scale, softcap, causal, window) as facts."""
    if meta is None:
        return None
    return tuple(LayerFacts(scale=meta["scale"][l], softcap=meta["softcap"][l], causal=meta["causal"][l],
                            window=meta["window"][l]) for l in range(num_layers))


def _read_v1(header: dict, archive: Any) -> dict:
    """The flat record of version 1: the model's own attention at the top (arrays ``weights_<i>``,
    ``queries_<i>``, ``keys_<i>``, ``position_bias_<i>``), an encoder–decoder's decoder under the
    header's ``decoder`` (arrays prefixed ``decoder.``) and its cross-attention as ``cross_<i>``,
    ``cross_queries_<i>``, ``cross_keys_<i>``, ``cross_position_bias_<i>``."""
    n = len(header["sentences"])

    def arrays(name: str) -> list[np.ndarray] | None:
        return [archive[f"{name}_{i}"] for i in range(n)] if f"{name}_0" in archive.files else None

    def record(names: tuple[str, str, str, str], query_side: Tokens, key_side: Tokens, meta: dict | None,
               num_layers: int, num_heads: int) -> Attention:
        weights, queries, keys, bias = (arrays(name) for name in names)
        return Attention(weights=weights, query_side=query_side, key_side=key_side, num_layers=num_layers,
                         num_heads=num_heads, queries=queries, keys=keys, position_bias=bias,
                         layers=_facts(meta, num_layers))

    source = _tokens(header)
    own = record(("weights", "queries", "keys", "position_bias"), source, source, header.get("qk_meta"),
                 header["num_layers"], header["num_heads"])
    decoder = cross = None
    if "decoder" in header:
        dec = header["decoder"]
        target, shape = _tokens(dec), (dec["num_layers"], dec["num_heads"])
        decoder = record(("decoder.weights", "decoder.queries", "decoder.keys", "decoder.position_bias"), target,
                         target, dec.get("qk_meta"), *shape)
        cross = record(("cross", "cross_queries", "cross_keys", "cross_position_bias"), target, source,
                       header.get("cross_qk_meta"), *shape)
    return _fields(header, own, decoder, cross)
