"""The viewer's JSON API as pydantic models: what each endpoint takes (strict: no extra keys, no
type coercion) and answers, which FastAPI turns into the OpenAPI schema at ``/openapi.json``.

Made by :func:`api_models` rather than at import, so that importing attnlab's modules never imports
pydantic (the web server's extra); the server calls it once per app.
"""

# No `from __future__ import annotations`: pydantic and FastAPI read these models, local to the
# functions below, from their live annotations.
from types import SimpleNamespace
from typing import Annotated, Any, Literal

from attnlab.web.api_decoders import MAX_WORD_CHARS, circuit_models, generation_models, pydantic_models

Level = Literal["word", "token"]
Attention = Literal["encoder", "decoder", "cross"]  # attnlab.viz.payload.ATTENTIONS
ATTENTION_HELP = ("encoder: the model's own self-attention (an encoder–decoder's encoder); decoder: an encoder–decoder's "
             "decoder self-attention; cross: its cross-attention (target rows, source columns)")


def api_models(max_sentences: int, max_chars: int, default_overview: int, max_new: int = 128,
               long_chars: int = 262_144, max_tile: int = 512, max_top: int = 100) -> SimpleNamespace:
    """Every request and answer model of the API, for sentences of at most ``max_chars``
    characters, at most ``max_sentences`` at a time, generations of at most ``max_new`` tokens, and
    the long view's texts of at most ``long_chars`` characters, tiles of ``max_tile`` and ``max_top`` top keys."""
    return SimpleNamespace(**_requests(max_sentences, max_chars, default_overview), **_map_answers(),
                           **_head_answers(), **_scene_answers(), **generation_models(max_chars, max_new),
                           **circuit_models(max_chars), **_long_requests(long_chars, max_tile, max_top),
                           **_long_answers())


def _long_requests(long_chars: int, max_tile: int, max_top: int) -> dict[str, type]:
    """What the long view (/api/long/*) takes: one text of up to ``long_chars`` characters, a head, a place."""
    from pydantic import BaseModel, ConfigDict, Field

    Text = Annotated[str, Field(min_length=1, max_length=long_chars, pattern=r"\S",
                                description="one text (a tab makes a pair), up to the model's positions")]
    Pos = Annotated[int, Field(ge=0, lt=2**31)]

    class LongIn(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        text: Text

    class LongHeadIn(LongIn):
        layer: int = Field(ge=0, lt=1000, description="0-based")
        head: int = Field(ge=0, lt=1000, description="0-based")

    class LongOverviewIn(LongHeadIn):
        cells: int = Field(512, ge=1, le=512, description="the overview's side at most, in cells")

    class LongTileIn(LongHeadIn):
        rows: list[Pos] = Field(min_length=2, max_length=2, description=f"[start, stop) of the queries, at most {max_tile}")
        cols: list[Pos] = Field(min_length=2, max_length=2, description=f"[start, stop) of the keys, at most {max_tile}")

    class LongRowIn(LongHeadIn):
        query: Pos
        top: int = Field(10, ge=1, le=max_top, description="how many top keys")

    class LongColumnIn(LongHeadIn):
        key: Pos

    return pydantic_models(locals())


def _long_answers() -> dict[str, type]:
    """What the long view answers: sizes, and weights as base64 float32."""
    from pydantic import BaseModel, Field

    F32 = "base64 of little-endian float32, row-major"

    class LongModelOut(BaseModel):
        id: str
        revision: str | None
        num_layers: int
        num_heads: int

    class LongInfoOut(BaseModel):
        model: LongModelOut
        tokens: list[str]
        is_mark: list[bool]
        num_tokens: int
        held_bytes: int = Field(description="what the server keeps for the text: queries, keys, row LSEs")
        full_bytes: int = Field(description="what its full map would take: L·H·T² float32")
        full_size: str
        max_tile: int

    class LongOverviewOut(BaseModel):
        layer: int
        head: int
        block: int = Field(description="each cell pools block × block weights (the last ones narrower)")
        cells: int
        num_tokens: int
        mean: str = Field(description=f"cells × cells mean weights, {F32}")
        max: str = Field(description=f"cells × cells largest weights, {F32}")
        encoding: str
        sink_share: str | None = Field(None, description=f"learned sinks: each row of cells' mean share of its "
                                                         f"queries' attention on the sink, {F32}; null without sinks")

    class LongTileOut(BaseModel):
        layer: int
        head: int
        rows: list[int]
        cols: list[int]
        weights: str = Field(description=f"the exact weights, {F32}")
        encoding: str

    class TopKeyOut(BaseModel):
        key: int
        token: str
        weight: float

    class LongRowOut(BaseModel):
        layer: int
        head: int
        query: int
        weights: str = Field(description=f"the query's weight on every key, {F32}")
        top: list[TopKeyOut]
        sink_share: float | None = Field(None, description="learned sinks: the query's attention on the sink (its "
                                                           "weights add up to 1 minus it); null without sinks")

    class LongColumnOut(BaseModel):
        layer: int
        head: int
        key: int
        weights: str = Field(description=f"every query's weight on the key, {F32}")

    return pydantic_models(locals())


def _requests(max_sentences: int, max_chars: int, default_overview: int) -> dict[str, type]:
    """What each endpoint takes: strict (no extra keys, no type coercion), sizes bounded."""
    from pydantic import BaseModel, ConfigDict, Field

    Sentence = Annotated[str, Field(min_length=1, max_length=max_chars, pattern=r"\S")]
    Word = Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS, pattern=r"\S")]
    Occurrence = Annotated[int, Field(ge=1, le=1000)]
    Sentences = Annotated[list[Sentence], Field(
        min_length=1, max_length=max_sentences,
        description="sentences; a tab makes a pair: segments A and B, or an encoder–decoder's source and target")]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class MapsIn(Strict):
        sentences: Sentences
        level: Level = "word"
        overview: int = Field(default_overview, ge=4, le=64, description="side of the model view's downsampled maps")

    class OneHead(Strict):  # one head of one sentence: what /api/head and /api/neuron share
        sentences: Sentences
        sentence: int = Field(0, ge=0, lt=max_sentences, description="which sentence, 0-based")
        layer: int = Field(ge=0, lt=1000, description="0-based")
        head: int = Field(ge=0, lt=1000, description="0-based")
        attention: Attention = Field("encoder", description=ATTENTION_HELP)

    class HeadIn(OneHead):
        level: Level = "word"

    class NeuronIn(OneHead):  # queries and keys are the tokens': no level
        pass

    class RolloutIn(Strict):
        sentences: Sentences
        level: Level = "word"
        sentence: int = Field(0, ge=0, lt=max_sentences, description="which sentence, 0-based")
        layer: int = Field(ge=0, lt=1000, description="0-based: rollout (or flow) through layers 0..layer")
        residual: float = Field(0.5, ge=0, lt=1, allow_inf_nan=False,
                                description="weight of the identity mixed into each layer's head mean, in [0, 1)")
        method: Literal["rollout", "flow"] = Field("rollout", description="attention rollout, or attention flow "
                                                   "(maximum flow; short sentences only: flow_max_positions)")

    class FindHeadIn(Strict):
        sentences: Sentences
        target: Word
        deciders: list[Word] = Field(min_length=1, max_length=max_sentences, description="one per sentence")
        exclude_self: bool = False
        exclude_marks: bool = False
        occurrence: Occurrence | Annotated[list[Occurrence | None], Field(min_length=1, max_length=max_sentences)] | None = Field(
            None, description="where the target occurs more than once: which occurrence to search, 1-based; one "
            "number for every sentence, or one per sentence (null: the first); default the first")

    return pydantic_models(locals())


def _map_answers() -> dict[str, type]:
    """What /api/info, /api/maps and /api/roles answer, and the error body."""
    from pydantic import BaseModel, Field

    class ErrorOut(BaseModel):
        detail: str

    class ModelOut(BaseModel):
        id: str
        revision: str | None
        num_layers: int
        num_heads: int

    class GenerateInfoOut(BaseModel):
        refusal: str | None = Field(description="why this model cannot generate (an encoder); null: it can")
        max_new_tokens: int

    class CircuitsInfoOut(BaseModel):
        refusal: str | None = Field(description="why /api/patch and /api/attribute cannot run this model (an "
                                    "encoder); null: they can")

    class InfoOut(BaseModel):
        model_id: str
        revision: str | None
        num_layers: int
        num_heads: int
        max_tokens: int
        max_sentences: int
        max_chars: int
        long_max_chars: int = Field(description="characters of one text of the long view (/api/long/*)")
        encoder_decoder: bool = Field(description="sentences are source<TAB>target pairs; attentions decoder and cross exist")
        generate: GenerateInfoOut = Field(description="what /api/generate can do with this model")
        circuits: CircuitsInfoOut = Field(description="whether /api/patch and /api/attribute can run this model")

    class OverviewOut(BaseModel):
        size: int
        maps: list[list[list[float]]] = Field(description="[layer][head] → size·size cells, row-major")

    class SentenceOut(BaseModel):
        text: str
        labels: list[str]
        is_mark: list[bool]
        overview: OverviewOut

    class BadgeOut(BaseModel):
        role: str
        layer: int
        head: int
        score: float

    class RolesOut(BaseModel):
        scores: dict[str, list[list[float]]]
        badges: list[BadgeOut]
        legend: dict[str, str]

    class ShapeOut(BaseModel):
        num_layers: int
        num_heads: int

    class PairOut(BaseModel):
        source: list[str] = Field(description="the encoder's tokens or words: the keys of cross-attention")
        source_is_mark: list[bool]
        target: list[str] = Field(description="the decoder's input (its start token, then the target): the queries")
        target_is_mark: list[bool]

    class Seq2SeqOut(BaseModel):
        model: ShapeOut = Field(description="the decoder's layers and heads")
        level: Level = Field(description="the level of the decoder and cross maps /api/head serves")
        sentences: list[PairOut]

    class MapsOut(BaseModel):
        model: ModelOut
        level: Level
        sentences: list[SentenceOut]
        roles: RolesOut
        seq2seq: Seq2SeqOut | None = Field(None, description="an encoder–decoder's decoder and cross-attention labels")

    return pydantic_models(locals())


def _head_answers() -> dict[str, type]:
    """What /api/head, /api/neuron, /api/rollout and /api/find-head answer."""
    from pydantic import BaseModel, Field

    class HeadOut(BaseModel):
        sentence: int
        layer: int
        head: int
        attention: Attention
        level: Level = Field(description="the level served (decoder and cross maps may be tokens where words were asked)")
        labels: list[str] = Field(description="the rows: the tokens or words that look")
        key_labels: list[str] = Field(description="the columns: those looked at (the source's, for cross)")
        weights: list[list[float]] = Field(description="[from][to], each row sums to 1 (minus its sink share, "
                                                       "for a model with learned sinks)")
        sink_share: list[float] | None = Field(None, description="[from]: learned sinks (gpt-oss): each row's share of "
                                                                "the sink, the rest of its 1; null without sinks")

    class LayerMetaOut(BaseModel):
        scale: float
        softcap: float | None
        causal: bool
        window: list[int] | None = Field(description="(left, right): key j is seen from i when i − left ≤ j ≤ i + right")
        sink_logits: list[float] | None = Field(None, description="learned sinks (gpt-oss): one logit per head in "
                                                                 "each row's softmax, with no value; absent without")

    class NeuronOut(BaseModel):
        sentence: int
        layer: int
        head: int
        attention: Attention
        labels: list[str] = Field(description="the query tokens (rows)")
        key_labels: list[str] = Field(description="the key tokens (columns)")
        q: list[list[float]] = Field(description="[Tq][D] queries as the attention received them (after RoPE, before scaling)")
        k: list[list[float]] = Field(description="[Tk][D] keys (grouped-query keys repeated per query head)")
        bias: list[list[float]] | None = Field(description="[Tq][Tk] added to the scores (T5's relative position bias); null: none")
        meta: LayerMetaOut

    class RolloutOut(BaseModel):
        sentence: int
        level: Level
        layer: int
        residual: float
        method: Literal["rollout", "flow"]
        num_layers: int
        labels: list[str] = Field(description="the positions, rows and columns alike")
        weights: list[list[float]] = Field(description="[position][source]: how much of each input position reaches "
                                                       "the position after layers 0..layer (0-based); each row sums to 1")
        flow_max_positions: int = Field(description="the longest sentence, in positions, that flow is offered for")
        flow_refusal: str | None = Field(description="why flow is not offered for this sentence; null: it is")

    class SideOut(BaseModel):
        sentence: str
        words: list[str]
        row: list[float]
        target_index: int
        decider_index: int

    class ShownOut(BaseModel):
        layer: int
        head: int
        qualifies: bool
        sides: list[SideOut]

    class FindHeadOut(BaseModel):
        summary: str
        result: dict[str, Any]
        shown: ShownOut | None
        note: str | None = Field(None, description="which occurrence was searched, where the target occurs more "
                                 "than once and none was asked for")

    return pydantic_models(locals())


def _scene_answers() -> dict[str, type]:
    """What /api/scene answers: the lesson's scene, unscaled and scaled."""
    from pydantic import BaseModel

    class SceneRun(BaseModel):
        scaled: bool
        scale: float
        scores: list[float]
        weights: list[float]
        output: list[float]

    class SceneOut(BaseModel):
        tokens: list[str]
        query_token: str
        query: list[float]
        keys: list[list[float]]
        values: list[list[float]]
        value_axes: list[str]
        unscaled: SceneRun
        scaled: SceneRun

    return pydantic_models(locals())
