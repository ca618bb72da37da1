"""The local web viewer: a FastAPI app over the maps API, and the page in ``static/``.

The model is fixed when the app is made (``create_app(model, revision)``); it is loaded once, on
first use, and every model call holds one lock (torch already uses every core). Captures are kept
in a small LRU cache, so choosing another head of the same sentences costs no model call.

Safety: input sizes are bounded (characters per sentence, number of sentences, tokens up to the
model's maximum); a malformed request gets a 422 with the field that is wrong, a well-formed one
the model cannot take (too many tokens, a word not in the sentence) a 400 with a message; no
endpoint reads or writes a file on the client's behalf (the page's files are read once, from the
package, when the app is made). Bind to 127.0.0.1 unless told otherwise.
"""

# No `from __future__ import annotations`: FastAPI reads the request models, which are local to
# create_app, from the live annotations.
import json
import logging
import os
import threading
from collections import OrderedDict
from importlib import resources
from typing import Annotated, Any, Callable, Literal

from attnlab.viz import payload
from attnlab.viz.assets import STATIC_FILES, read_static

log = logging.getLogger(__name__)

MAX_SENTENCES = 2  # the viewer compares at most two sentences
MAX_CHARS = 4000  # per sentence: room for 512 tokens of ordinary text, no more
MAX_WORD_CHARS = 100
CACHE_SIZE = 8  # captured sentence sets kept for head requests
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
class MapsCache:
    """Captured maps by request, least recently used out first; one lock around every model call."""

    def __init__(self, model: Any, revision: str | None, size: int = CACHE_SIZE) -> None:
        self.model, self.revision, self.size = model, revision, size
        self.lock = threading.RLock()  # maps_payload holds it around get()
        self.entries: OrderedDict[tuple, Any] = OrderedDict()
        self.payloads: OrderedDict[tuple, dict] = OrderedDict()

    def loaded(self) -> Any:
        from attnlab.models.loading import LoadedModel, load_model

        if isinstance(self.model, LoadedModel):
            return self.model
        with self.lock:
            return load_model(self.model, self.revision)

    def get(self, sentences: list[str], level: str) -> Any:
        """Token-level AttentionMaps (``level="token"``) or word-level WordMaps of the sentences."""
        from attnlab.models.capture import capture

        key = (tuple(sentences), level)
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key]
            maps = capture(sentences, self.model, self.revision)
            for lev, m in (("token", maps), ("word", maps.to_words())):
                self.entries[(tuple(sentences), lev)] = m
            while len(self.entries) > 2 * self.size:
                self.entries.popitem(last=False)
            return self.entries[key]

    def maps_payload(self, sentences: list[str], level: str, overview: int) -> dict:
        """:func:`payload.maps_payload` of the sentences, computed once (roles and downsampling of
        512 tokens take a second)."""
        key = (tuple(sentences), level, overview)
        with self.lock:
            if key not in self.payloads:
                self.payloads[key] = payload.maps_payload(self.get(sentences, level), overview=overview)
                while len(self.payloads) > self.size:
                    self.payloads.popitem(last=False)
            self.payloads.move_to_end(key)
            return self.payloads[key]


def create_app(model: Any = None, revision: str | None = None, *, preload: bool = False, scene: dict | None = None):
    """The viewer's ASGI app for one model: None (the bundled all-MiniLM-L6-v2), a folder, a hub id
    (with ``revision``), or a :class:`~attnlab.models.loading.LoadedModel` already in memory.

    ``preload=True`` loads the model now, so a bad ``model`` fails here rather than on the first
    request (``attnlab serve`` does this). ``scene``: the lesson's scene (``attnlab.lesson.scene.scene()``)
    that /api/scene serves, handed in by the caller (the viewer sits below the lesson); None hides it.
    """
    from fastapi import FastAPI, HTTPException
    from fastapi.middleware.gzip import GZipMiddleware
    from fastapi.responses import Response
    from pydantic import BaseModel, ConfigDict, Field

    cache = MapsCache(model, revision)
    if preload:
        cache.loaded()
    pages = {path: (read_static(name), media) for path, (name, media) in STATIC_FILES.items()}

    Sentence = Annotated[str, Field(min_length=1, max_length=MAX_CHARS, pattern=r"\S")]
    Word = Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS, pattern=r"\S")]
    Level = Literal["word", "token"]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class MapsIn(Strict):
        sentences: list[Sentence] = Field(min_length=1, max_length=MAX_SENTENCES)
        level: Level = "word"
        overview: int = Field(payload.DEFAULT_OVERVIEW, ge=4, le=64, description="side of the model view's downsampled maps")

    class HeadIn(Strict):
        sentences: list[Sentence] = Field(min_length=1, max_length=MAX_SENTENCES)
        level: Level = "word"
        sentence: int = Field(0, ge=0, lt=MAX_SENTENCES, description="which sentence, 0-based")
        layer: int = Field(ge=1, le=1000, description="1-based")
        head: int = Field(ge=1, le=1000, description="1-based")

    class FindHeadIn(Strict):
        sentences: list[Sentence] = Field(min_length=1, max_length=MAX_SENTENCES)
        target: Word
        deciders: list[Word] = Field(min_length=1, max_length=MAX_SENTENCES, description="one per sentence")
        exclude_self: bool = False
        exclude_marks: bool = False

    class ErrorOut(BaseModel):
        detail: str

    bad_request = {400: {"model": ErrorOut, "description": "Well-formed, but the model cannot take it (too many tokens, a word not in the sentence, a layer out of range)"}}

    class ModelOut(BaseModel):
        id: str
        revision: str | None
        num_layers: int
        num_heads: int

    class InfoOut(BaseModel):
        model_id: str
        revision: str | None
        num_layers: int
        num_heads: int
        max_tokens: int
        max_sentences: int
        max_chars: int

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

    class MapsOut(BaseModel):
        model: ModelOut
        level: Level
        sentences: list[SentenceOut]
        roles: RolesOut

    class HeadOut(BaseModel):
        sentence: int
        layer: int
        head: int
        labels: list[str]
        weights: list[list[float]] = Field(description="[from][to], each row sums to 1")

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

    app = FastAPI(
        title="attnlab viewer",
        description="Attention maps of one pretrained model, the lesson's scene, head roles and the head search.",
        version="1",
        docs_url=None,  # FastAPI's /docs and /redoc load their scripts from a CDN; the schema is /openapi.json
        redoc_url=None,
    )
    # Level 1: a 512 x 512 map (2.0 MB of JSON) goes to 0.62 MB and the request takes 0.2 s;
    # level 9, the default, gives 0.46 MB but takes 1.4 s (benchmarks/bench_viewer.py).
    app.add_middleware(GZipMiddleware, minimum_size=2048, compresslevel=1)

    def maps_for(sentences: list[str], level: str, overview: int | None = None) -> Any:
        """The captured maps, or with ``overview`` their payload; what the model refuses is a 400."""
        try:
            if overview is not None:
                return cache.maps_payload(sentences, level, overview)
            return cache.get(sentences, level)
        except (ValueError, LookupError) as e:  # too many tokens, an empty sentence: the client's to fix
            raise HTTPException(status_code=400, detail=str(e)) from None

    def big_json(data: dict) -> Response:
        # The big answers (a 512 x 512 map is 262,144 numbers) skip the response model's
        # validation, which costs a second there; the schema still documents them and the fuzz
        # tests check that the bodies conform to it.
        return Response(json.dumps(data, separators=(",", ":")), media_type="application/json")

    for path, (text, media) in pages.items():
        app.add_api_route(path, (lambda t=text, m=media: Response(t, media_type=m)), methods=["GET"], include_in_schema=False)

    @app.get("/api/info", response_model=InfoOut)
    def info() -> dict:
        lm = cache.loaded()
        limit = min(lm.tokenizer.model_max_length, lm.config.get("max_position_embeddings") or 10**9)
        return {"model_id": lm.model_id, "revision": lm.revision, "num_layers": lm.num_layers,
                "num_heads": lm.num_heads, "max_tokens": int(limit), "max_sentences": MAX_SENTENCES,
                "max_chars": MAX_CHARS}

    @app.get("/api/scene", response_model=SceneOut, responses={404: {"description": "this viewer was made without the scene"}})
    def scene_out() -> dict:
        if scene is None:
            raise HTTPException(404, "this viewer was made without the lesson's scene")
        return scene

    @app.post("/api/maps", response_model=MapsOut, responses=bad_request)
    def maps(req: MapsIn) -> Response:
        """Labels, marks, downsampled maps of every head and the role badges; full maps: /api/head."""
        return big_json(maps_for(req.sentences, req.level, req.overview))

    @app.post("/api/head", response_model=HeadOut, responses=bad_request)
    def head(req: HeadIn) -> Response:
        """One head's full map (1-based layer and head) of one sentence."""
        m = maps_for(req.sentences, req.level)
        try:
            w = payload.head_matrix(m, req.sentence, req.layer, req.head)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        return big_json({"sentence": req.sentence, "layer": req.layer, "head": req.head,
                         "labels": payload.labels(m, req.sentence), "weights": payload.round_weights(w)})

    @app.post("/api/roles", response_model=RolesOut, responses=bad_request)
    def roles(req: MapsIn) -> dict:
        """Role scores ([layer][head] per role) over the sentences' word-level maps, and the badges."""
        return payload.roles_payload(maps_for(req.sentences, "word"))

    @app.post("/api/find-head", response_model=FindHeadOut, responses=bad_request)
    def find_head(req: FindHeadIn) -> dict:
        """The lesson's search: heads where the target's largest weight falls on each sentence's decider."""
        words = maps_for(req.sentences, "word")
        try:
            return payload.find_head_payload(words, req.target, req.deciders, req.exclude_self, req.exclude_marks)
        except (ValueError, LookupError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from None

    return app


def check_port(host: str, port: int) -> None:
    """Fail with a clear OSError when ``host:port`` cannot be bound (in use, no such address)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        reason = os.strerror(e.errno).lower() if e.errno else str(e)
        raise OSError(f"cannot listen on {host}:{port}: {reason}; pick another --port or --host") from None


def serve(model: Any = None, revision: str | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          announce: Callable[[str], None] | None = None, scene: dict | None = None) -> None:
    """Load the model, then serve the viewer with uvicorn until interrupted.

    ``announce`` gets a line when loading starts (the port is known to be free by then) and one
    with the viewer's URL when it is ready.
    """
    import uvicorn

    say = announce or log.info
    check_port(host, port)
    say(f"loading {model or 'the bundled all-MiniLM-L6-v2'}…")
    app = create_app(model, revision, preload=True, scene=scene)
    shown = f"[{host}]" if ":" in host else host
    say(f"attnlab viewer at http://{shown}:{port}/ (Ctrl+C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning")
