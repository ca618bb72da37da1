"""The API models of the views that run a decoder: /api/generate (the Generation view) and /api/patch,
/api/attribute (the circuits), made by :func:`attnlab.web.api_models.api_models` with the others."""

# No `from __future__ import annotations`: pydantic and FastAPI read these models from their live annotations.
from typing import Annotated, Any, Literal

from attnlab.transformer.sampling import MAX_TEMPERATURE

MAX_WORD_CHARS = 100
CACHES = Literal["dense", "window", "sink"]  # attnlab.transformer.cache.KINDS
MAX_CACHE_SLOTS = 65_536  # window= and sink= of /api/generate, at most


def pydantic_models(names: dict[str, Any]) -> dict[str, type]:
    """The pydantic models among a function's local ``names``."""
    from pydantic import BaseModel

    return {k: v for k, v in names.items() if isinstance(v, type) and issubclass(v, BaseModel) and v is not BaseModel}


def generation_models(max_chars: int, max_new: int) -> dict[str, type]:
    """What /api/generate takes (a prompt, at most ``max_new`` new tokens) and answers (every step's rows)."""
    from pydantic import BaseModel, ConfigDict, Field

    class GenerateIn(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        prompt: Annotated[str, Field(min_length=1, max_length=max_chars, pattern=r"\S")]
        max_new_tokens: int = Field(16, ge=1, le=max_new)
        temperature: float | None = Field(None, gt=0, le=MAX_TEMPERATURE, allow_inf_nan=False,
                                          description="sampling is on when temperature, top_k or top_p is given")
        top_k: int | None = Field(None, ge=1, le=1_000_000)
        top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
        seed: int | None = Field(None, ge=0, le=2**63 - 1, description="with sampling only")
        cache: CACHES = Field("dense", description="the KV cache, as the library's generate(cache=): dense (every "
                              "position), window (the last W), sink (the first S and the last W)")
        # a ring holds its W slots from the start: bounded, so that a request cannot ask for gigabytes
        window: int | None = Field(None, ge=1, le=MAX_CACHE_SLOTS, description="W of a window or sink cache")
        sink: int | None = Field(None, ge=1, le=MAX_CACHE_SLOTS, description="S of a sink cache (default 4)")

    class GenModelOut(BaseModel):
        id: str
        num_layers: int
        num_heads: int

    class StepOut(BaseModel):
        step: int = Field(description="0-based")
        position: int = Field(description="0-based position of the query: the token fed at this step")
        token: int = Field(description="the id this step chose (at position + 1)")
        rows: list[list[list[float]]] = Field(description="[layer][head][position + 1]: its attention over positions "
                                                          "0..position, post-softmax (0-based layers and heads)")

    class GenerateOut(BaseModel):
        model: GenModelOut
        labels: list[str] = Field(description="every token's text: the prompt's, then the new ones")
        prompt_length: int
        prompt: str | None
        text: str | None = Field(description="the new tokens decoded")
        steps: list[StepOut]

    return pydantic_models(locals())


def circuit_models(max_chars: int) -> dict[str, type]:
    """What /api/patch and /api/attribute take (texts of at most ``max_chars``, tokens as their text) and
    answer: ``heads`` [layer][head], 0-based, for the model view's colours."""
    from pydantic import BaseModel, ConfigDict, Field

    Text = Annotated[str, Field(min_length=1, max_length=max_chars, pattern=r"\S")]
    Token = Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS, description="one token of the model, as "
                                 "its text reads in running text (a leading space included: ' Paris')")]
    HEADS = "[layer][head], 0-based"

    class PatchIn(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        clean: Text = Field(description="the text where the model predicts target")
        corrupted: Text = Field(description="the same number of tokens, what matters changed")
        target: Token
        baseline: Token | None = Field(None, description="the metric becomes target's logit minus this one's")

    class AttributeIn(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        text: Text
        target: Token
        baseline: Token | None = None

    class CircuitModelOut(BaseModel):
        id: str
        num_layers: int
        num_heads: int

    class PatchOut(BaseModel):
        model: CircuitModelOut
        metric: str = Field(description="in words: the logit (difference) measured at the last position")
        target: int = Field(description="the target's token id")
        baseline: int | None
        clean_labels: list[str]
        corrupted_labels: list[str]
        heads: list[list[float]] = Field(description=f"{HEADS}: (patched − corrupted) / (clean − corrupted) of the "
                                         "metric, each head's output put back from the clean run")
        clean: float = Field(description="the metric on the clean text")
        corrupted: float = Field(description="the metric on the corrupted text")

    class ComponentOut(BaseModel):
        kind: str = Field(description="embed, pos_embed, head, mlp or bias")
        label: str = Field(description="for people: L1H3 (1-based), mlp 2, embed, bias")
        layer: int | None = Field(None, description="0-based, for a head or an MLP")
        head: int | None = Field(None, description="0-based, for a head")
        value: float

    class AttributeOut(BaseModel):
        model: CircuitModelOut
        metric: str
        labels: list[str] = Field(description="the text's tokens")
        target: int
        baseline: int | None
        heads: list[list[float]] = Field(description=f"{HEADS}: each head's direct contribution to the metric")
        components: list[ComponentOut] = Field(description="every component's direct contribution, in the "
                                               "model's order")
        total: float = Field(description="the sum of the components")
        logit: float = Field(description="the model's own logit (difference) at the last position, before any softcap")
        error: float = Field(description="total − logit")

    return pydantic_models(locals())
