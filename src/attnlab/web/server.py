"""The local web viewer: a FastAPI app over the maps API, and the page in ``static/``.

The model is fixed when the app is made (``create_app(model, revision)``) and loaded once, on first
use. The model's work (captures, roles, the head search, big JSON answers) runs in a bounded worker
pool off the event loop (:mod:`attnlab.web.work`): the page, ``/api/info`` and ``/api/scene`` answer
at once while it runs, and a request that finds the queue full gets 503 with ``Retry-After``.
Captures and answers are kept in a cache bounded in MB, so another head of the same sentences costs
no model call.

Full maps travel one head at a time (/api/head), and so do the Neuron view's queries and keys
(/api/neuron, from a capture with ``qk=True`` cached beside the others). One head's q and k are
2·T·D numbers, a quarter of its map at 512 tokens and D = 64, so the server serves them up to the
model's maximum length, where a self-contained page, which embeds every head, keeps them only for
sentences of up to :data:`attnlab.viz.neuron.NEURON_MAX_TOKENS` tokens.

Long inputs (:mod:`attnlab.web.longview`): /api/long/info, /overview, /tile, /row and /column take one
text of up to :data:`LONG_MAX_CHARS` characters (32,768 tokens at 8 characters each; tokens up to
the model's positions) and compute every weight on request from its cached queries, keys and row
LSEs; the full-map endpoints keep :data:`MAX_CHARS` and refuse a capture whose T × T weights would
pass :data:`attnlab.web.work.SERVER_MAP_BYTES`, with the bytes and the long view offered instead.
The page of the long view is ``/long``.

Safety: input sizes are bounded (characters per sentence, number of sentences, tokens up to the
model's maximum) and text must be valid Unicode; a malformed request gets a 422 whose message says
what is wrong in words, a well-formed one the model cannot take (too many tokens, a word not in the
sentence) a 400 with a message; no endpoint reads or writes a file on the client's behalf (the page's
files are read once, from the package, when the app is made). The server answers only to its own
host names and refuses cross-origin POSTs (:mod:`attnlab.web.guard`), and binds to 127.0.0.1 unless
told otherwise.

/api/generate runs attnlab's own transformer on the same weights, generating with its KV cache and
keeping each step's attention row (:mod:`attnlab.web.generation`); for an encoder /api/info says why
it cannot, and the Generation view shows that reason. /api/patch and /api/attribute run the circuit
tools on that transformer (:mod:`attnlab.web.circuits`), for the model view to colour its heads by.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' request models, made by
# api_models when the app is made, from the signatures :func:`_post` gives the endpoints.
import inspect
import json
import logging
from collections.abc import Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from attnlab.viz import payload
from attnlab.viz.assets import STATIC_FILES, read_static
from attnlab.viz.neuron import head_qk
from attnlab.viz.rollout_view import served_rollout
from attnlab.web import circuits, longview
from attnlab.web.attentions import attention_head
from attnlab.web.generation import MAX_NEW_TOKENS, Generator
from attnlab.web.api_models import api_models
from attnlab.web.guard import LocalOnly, allowed_hosts, check_port, host_warning, url_name
from attnlab.web.work import CACHE_MB, QUEUE, WORKERS, Busy, MapsCache, WorkerPool

__all__ = ["MapsCache", "check_port", "create_app", "serve"]

log = logging.getLogger(__name__)

MAX_SENTENCES = 2  # the viewer compares at most two sentences
MAX_CHARS = 4000  # per sentence of the full maps: room for 512 tokens of ordinary text, no more
LONG_MAX_CHARS = longview.LONG_MAX_CHARS  # per text of the long view (/api/long/*): room for 32,768 tokens
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
CLIENT_ERRORS = (ValueError, LookupError)  # raised by attnlab for what the model cannot take: a 400


@dataclass
class Viewer:
    """What every endpoint works with: the model's cache, the worker pool, the lesson's scene."""

    cache: MapsCache
    pool: WorkerPool
    scene: dict | None
    generator: Generator
    info: dict = field(default_factory=dict)

    def maps(self, sentences: list[str], level: str) -> Any:
        """The captured maps (``level`` "qk": token level with queries and keys); an encoder–decoder's
        sentence must be a source<TAB>target pair."""
        lm = self.cache.loaded()
        for i, s in enumerate(sentences):
            if lm.config.get("is_encoder_decoder") and (tabs := s.count("\t")) != 1:
                raise ValueError(f"sentences[{i}] has {tabs} tabs; {lm.model_id!r} is an encoder–decoder model: "
                                 f"give each sentence as its source and its target, separated by one tab")
        return self.cache.get_qk(sentences) if level == "qk" else self.cache.get(sentences, level)

    def info_now(self) -> dict:
        lm = self.cache.loaded()
        return {"model_id": lm.model_id, "revision": lm.revision, "num_layers": lm.num_layers,
                "num_heads": lm.num_heads, "max_tokens": lm.max_tokens, "max_sentences": MAX_SENTENCES,
                "max_chars": MAX_CHARS, "long_max_chars": LONG_MAX_CHARS, "encoder_decoder": bool(lm.config.get("is_encoder_decoder")),
                "generate": self.generator.info(), "circuits": {"refusal": self.generator.refusal(circuits.CANNOT)}}


# The POST endpoints: each a small function from the request to its answer, run on the worker pool
# (the big answers, a 512 x 512 map is 262,144 numbers, skip the response model's validation, which
# costs a second there; the schema documents them and the fuzz tests check the bodies against it).

def maps_answer(v: Viewer, req: Any) -> bytes:
    """Labels, marks, downsampled maps of every head and the role badges (an encoder's, or an
    encoder–decoder's encoder's), and for an encoder–decoder what the head view's decoder and
    cross choices need (``seq2seq``: the decoder's shape, the level served, source and target
    labels and marks); full maps: /api/head."""
    m = v.maps(req.sentences, req.level)

    def make() -> bytes:
        body = payload.maps_payload(m, overview=req.overview)
        pairs = payload.seq2seq_labels(m)
        if pairs is not None:
            body["seq2seq"] = pairs
        return to_json(body)

    return v.cache.computed((tuple(req.sentences), req.level, req.overview), make)


def head_answer(v: Viewer, req: Any) -> dict:
    """One head's full map (0-based layer and head) of one sentence: of the model's own attention
    (``attention`` "encoder"), or an encoder–decoder's decoder self-attention or cross-attention (target
    rows, source columns), at the level asked for (``level`` says which)."""
    got = attention_head(v.maps(req.sentences, req.level), req.attention, req.sentence, req.layer, req.head)
    share = got["sink_share"]  # (rows,) learned sinks: each row's share of the sink, or None
    return {"sentence": req.sentence, "layer": req.layer, "head": req.head, "attention": req.attention,
            **got, "weights": payload.round_weights(got["weights"]),
            "sink_share": None if share is None else payload.round_weights(share)}


def neuron_answer(v: Viewer, req: Any) -> dict:
    """One head's queries and keys (0-based layer and head) of one sentence, its tokens, the
    position bias where the model adds one (T5), and that layer's scale, softcap, causal and
    window: what the Neuron view turns into weights. ``attention`` as in /api/head; token level."""
    data = head_qk(v.maps(req.sentences, "qk"), req.sentence, req.layer, req.head, req.attention)
    return {"sentence": req.sentence, "layer": req.layer, "head": req.head, "attention": req.attention, **data}


def rollout_answer(v: Viewer, req: Any) -> dict:
    """Attention rollout (Abnar & Zuidema 2020), or attention flow, of one sentence through layers
    0..``layer`` (0-based) at ``residual``: row i, how much of each input position reaches position i."""
    m = v.maps(req.sentences, req.level)
    got = served_rollout(v.cache, m, (tuple(req.sentences), req.level), req.sentence, req.layer, req.residual,
                         req.method)
    return {"sentence": req.sentence, "level": req.level, "layer": req.layer, "residual": req.residual,
            "method": req.method, **got, "weights": payload.round_weights(got["weights"])}


def roles_answer(v: Viewer, req: Any) -> dict:
    """Role scores ([layer][head] per role) over the sentences' word-level maps, and the badges."""
    return payload.roles_payload(v.maps(req.sentences, "word"))


def find_head_answer(v: Viewer, req: Any) -> dict:
    """The lesson's search: heads where the target's largest weight falls on each sentence's decider."""
    return payload.find_head_payload(v.maps(req.sentences, "word"), req.target, req.deciders, req.exclude_self,
                                     req.exclude_marks, req.occurrence)


def generate_answer(v: Viewer, req: Any) -> dict:
    """Up to ``max_new_tokens`` after ``prompt`` with attnlab's transformer and its KV cache (greedy, or
    sampled when temperature, top_k or top_p is given) and every step's attention row: the Generation
    view. A model that cannot generate (an encoder) is a 400 saying so."""
    return v.generator.run(req.prompt, req.max_new_tokens, req.temperature, req.top_k, req.top_p, req.seed, req.cache,
                           req.window, req.sink)


def patch_answer(v: Viewer, req: Any) -> dict:
    """Activation patching: each head's output put back from the clean text into the corrupted one (as many
    tokens), and how much of the clean logit of ``target`` (minus ``baseline``'s) at the last position it
    restores, [layer][head] (0-based): what the model view colours its heads by. A model without next-token
    logits (an encoder) is a 400 saying so."""
    return circuits.patched(v.generator, req.clean, req.corrupted, req.target, req.baseline)


def attribute_answer(v: Viewer, req: Any) -> dict:
    """Direct logit attribution: what each head, MLP, the embeddings and the biases write straight into the
    logit of ``target`` (minus ``baseline``'s) at the last position of ``text``; the heads also as
    [layer][head] (0-based), and the check that the parts add up to the model's own logit."""
    return circuits.attributed(v.generator, req.text, req.target, req.baseline)


def long_info_answer(v: Viewer, req: Any) -> dict:
    """The long view of one text (any length the model takes, up to ``long_max_chars`` characters):
    its tokens, marks, and what the server holds for it (queries, keys and row LSEs) against what its
    full map would take. The weights come from /api/long/overview, /tile, /row and /column."""
    return longview.info(longview.long_maps(v.cache, req.text))


def long_overview_answer(v: Viewer, req: Any) -> bytes:
    """One head's pooled map (0-based layer and head): each cell the mean and the max weight of a block of
    block × block pairs, at most ``cells`` × ``cells``, computed exactly from the queries, keys and row LSEs."""
    lm = longview.long_maps(v.cache, req.text)
    return v.cache.computed(("long-overview", req.text, req.layer, req.head, req.cells),
                            lambda: to_json(longview.overview(lm, req.layer, req.head, req.cells)))


def long_tile_answer(v: Viewer, req: Any) -> dict:
    """The exact weights of queries ``rows`` [start, stop) on keys ``cols`` [start, stop), at most
    ``max_tile`` each; outside the map, a 400 that says its size."""
    return longview.tile(longview.long_maps(v.cache, req.text), req.layer, req.head, req.rows, req.cols)


def long_row_answer(v: Viewer, req: Any) -> dict:
    """Query ``query``'s weight on every key and its ``top`` keys with their tokens, exact."""
    return longview.row(longview.long_maps(v.cache, req.text), req.layer, req.head, req.query, req.top)


def long_column_answer(v: Viewer, req: Any) -> dict:
    """The weight every query puts on key ``key``: who attends to it, exact."""
    return longview.column(longview.long_maps(v.cache, req.text), req.layer, req.head, req.key)


POSTS = (  # path, request model, answer model, answer
    ("/api/maps", "MapsIn", "MapsOut", maps_answer),
    ("/api/head", "HeadIn", "HeadOut", head_answer),
    ("/api/neuron", "NeuronIn", "NeuronOut", neuron_answer),
    ("/api/rollout", "RolloutIn", "RolloutOut", rollout_answer),
    ("/api/roles", "MapsIn", "RolesOut", roles_answer),
    ("/api/find-head", "FindHeadIn", "FindHeadOut", find_head_answer),
    ("/api/generate", "GenerateIn", "GenerateOut", generate_answer),
    ("/api/patch", "PatchIn", "PatchOut", patch_answer),
    ("/api/attribute", "AttributeIn", "AttributeOut", attribute_answer),
    ("/api/long/info", "LongIn", "LongInfoOut", long_info_answer),
    ("/api/long/overview", "LongOverviewIn", "LongOverviewOut", long_overview_answer),
    ("/api/long/tile", "LongTileIn", "LongTileOut", long_tile_answer),
    ("/api/long/row", "LongRowIn", "LongRowOut", long_row_answer),
    ("/api/long/column", "LongColumnIn", "LongColumnOut", long_column_answer),
)


def to_json(data: dict) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def answered(v: Viewer, answer: Callable[[Viewer, Any], Any], req: Any) -> bytes:
    """``answer`` as JSON bytes, on the worker; attnlab's refusals (:data:`CLIENT_ERRORS`: too many
    tokens, a word not in the sentence, a layer out of range) become one 400 with their message."""
    from fastapi import HTTPException

    from attnlab.web.messages import encodable

    from attnlab.maps.long import MapTooLarge

    try:
        got = answer(v, req)
    except MapTooLarge as e:  # the full map of a long input: its size, and the long view offered instead
        detail = e.said(e.what, e.needed, e.limit, "this viewer's long view computes any part of it exactly: POST "
                        "/api/long/info, /api/long/overview, /api/long/tile, /api/long/row, /api/long/column")
        raise HTTPException(status_code=400, detail=encodable(detail)) from None
    except CLIENT_ERRORS as e:
        raise HTTPException(status_code=400, detail=encodable(str(e))) from None
    return got if isinstance(got, bytes) else to_json(got)


def _post(app: Any, v: Viewer, path: str, body: type, out: type, answer: Callable, responses: dict) -> None:
    """Route POST ``path``: its body read as ``body``, documented as answering ``out``, computed by ``answer``."""
    from fastapi.responses import Response

    async def endpoint(req: Any) -> Response:
        return Response(await v.pool.run(lambda: answered(v, answer, req)), media_type="application/json")

    param = inspect.Parameter("req", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=body)
    endpoint.__signature__ = inspect.Signature([param], return_annotation=Response)  # FastAPI reads the model here
    endpoint.__name__ = answer.__name__.removesuffix("_answer")
    app.add_api_route(path, endpoint, methods=["POST"], response_model=out, responses=responses,
                      description=inspect.cleandoc(answer.__doc__ or ""))


def _gets(app: Any, v: Viewer, M: Any, busy_doc: dict) -> None:
    """The page's files, /api/info and /api/scene: answered at once, whatever the workers are doing."""
    from fastapi import HTTPException
    from fastapi.responses import Response

    def page_route(text: str, media: str):
        async def page() -> Response:
            return Response(text, media_type=media)
        return page

    for path, (name, media) in STATIC_FILES.items():  # read once, from the package, when the app is made
        app.add_api_route(path, page_route(read_static(name), media), methods=["GET"], include_in_schema=False)

    async def info() -> dict:
        if not v.info:  # only a first call before the model is loaded waits, for the loading
            v.info.update(v.info_now() if v.cache.is_loaded else await v.pool.run(v.info_now))
        return v.info

    async def scene_out() -> dict:
        if v.scene is None:
            raise HTTPException(404, "this viewer was made without the lesson's scene")
        return v.scene

    app.add_api_route("/api/info", info, methods=["GET"], response_model=M.InfoOut, responses=busy_doc)
    app.add_api_route("/api/scene", scene_out, methods=["GET"], response_model=M.SceneOut,
                      responses={404: {"description": "this viewer was made without the scene"}})


async def _invalid(_request: Any, exc: Any) -> Any:
    """A 422 whose every message says in words what is wrong (:mod:`attnlab.web.messages`)."""
    from fastapi.responses import JSONResponse

    from attnlab.web.messages import validation_detail

    return JSONResponse(status_code=422, content={"detail": validation_detail(exc.errors(), MAX_SENTENCES, MAX_CHARS)})


async def _busy(_request: Any, exc: Busy) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": str(exc.retry_after)})


def create_app(model: Any = None, revision: str | None = None, *, preload: bool = False, scene: dict | None = None,
               hosts: Iterable[str] | None = None, workers: int = WORKERS, queue: int = QUEUE,
               cache_mb: float = CACHE_MB):
    """The viewer's ASGI app for one model: None (the bundled all-MiniLM-L6-v2), a folder, a hub id
    (with ``revision``), or a :class:`~attnlab.hf.loading.LoadedModel` already in memory.

    ``preload=True`` loads the model now, so a bad ``model`` fails here rather than on the first
    request (``attnlab serve`` does this). ``scene``: the lesson's scene (``attnlab.lesson.scene.scene()``)
    that /api/scene serves, handed in by the caller (the viewer sits below the lesson); None hides it.
    ``hosts``: the Host names to answer to (default: 127.0.0.1, localhost, [::1];
    :func:`attnlab.web.guard.allowed_hosts` makes the set for a bind address). ``workers`` threads do
    the model's work, ``queue`` more requests may wait for them, the cache keeps ``cache_mb`` MB.
    """
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.middleware.gzip import GZipMiddleware

    maps_cache = MapsCache(model, revision, max_mb=cache_mb)
    v = Viewer(maps_cache, WorkerPool(workers, queue), scene, Generator(maps_cache))
    if preload:
        v.cache.loaded()

    @asynccontextmanager
    async def lifespan(_app):
        yield
        v.pool.shutdown()

    app = FastAPI(
        title="attnlab viewer",
        description="Attention maps of one pretrained model, the lesson's scene, head roles and the head search.",
        version="1",
        docs_url=None,  # FastAPI's /docs and /redoc load their scripts from a CDN; the schema is /openapi.json
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.pool, app.state.cache = v.pool, v.cache  # for tests and benchmarks to look at
    # Level 1: weights as JSON compress well at the fastest level, and the higher levels save a little
    # more for several times the time (measured by benchmarks/bench_viewer.py: benchmarks/README.md).
    app.add_middleware(GZipMiddleware, minimum_size=2048, compresslevel=1)
    app.add_middleware(LocalOnly, hosts=allowed_hosts() if hosts is None else hosts)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Busy, _busy)

    M = api_models(MAX_SENTENCES, MAX_CHARS, payload.DEFAULT_OVERVIEW, MAX_NEW_TOKENS, LONG_MAX_CHARS, longview.MAX_TILE,
                   longview.MAX_TOP)
    busy_doc = {503: {"model": M.ErrorOut,
                      "description": "Every worker is busy and the queue is full; see Retry-After"}}
    heavy_doc = {400: {"model": M.ErrorOut, "description": "Well-formed, but the model cannot take it (too many "
                       "tokens, a word not in the sentence, a layer out of range)"}, **busy_doc}
    _gets(app, v, M, busy_doc)
    for path, body, out, answer in POSTS:
        _post(app, v, path, getattr(M, body), getattr(M, out), answer, heavy_doc)
    return app


def serve(model: Any = None, revision: str | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          announce: Callable[[str], None] | None = None, scene: dict | None = None) -> None:
    """Load the model, then serve the viewer with uvicorn until interrupted.

    ``announce`` gets a warning first when ``host`` is reachable from other machines, a line when
    loading starts (the address is known to be free by then), and one with the viewer's URL when it
    is ready. A host or port that cannot be bound is an OSError before anything loads.
    """
    import uvicorn

    say = announce or log.info
    check_port(host, port)
    warning = host_warning(host)
    if warning:
        say(warning)
    say(f"loading {model or 'the bundled all-MiniLM-L6-v2'}…")
    app = create_app(model, revision, preload=True, scene=scene, hosts=allowed_hosts(host))
    say(f"attnlab viewer at http://{url_name(host)}:{port}/ (Ctrl+C to stop)")
    uvicorn.run(app, host=host.strip("[]"), port=port, log_level="warning")
