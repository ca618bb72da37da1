"""Run the whole lesson: eight sections, in one pass, with a callback for progress.

``LessonConfig`` holds what the user can set (the CLI flags map onto it); ``run_lesson`` returns
a :class:`Lesson`, plain data that the CLI prints, :mod:`attnlab.lesson.report` writes, and
``lesson.json`` stores (its schema: ``lesson/schema.json``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnlab.lesson.cost import CostConfig, cost_section
from attnlab.lesson.formula import formula_section, qkv_section
from attnlab.lesson.heads import heads_section
from attnlab.lesson.nextsteps import next_section
from attnlab.lesson.realmaps import capture_bank, maps_section, model_info
from attnlab.lesson.scaling import scaling_section
from attnlab.lesson.section import Section
from attnlab.lesson.transformer import transformer_section
from attnlab.maps.tokens import AttentionMaps

SCHEMA_VERSION = 1
DEFAULT_OUT = Path("attnlab-report")


@dataclass(frozen=True)
class LessonConfig:
    """``attnlab lesson`` flags: where the report goes, which model, the cost limits, the seed.

    ``seed`` seeds the lesson's own random draws (the small X, the saturation draws, the
    shuffle); the √d table always uses the seed document's ``default_rng(0)``, so it reproduces it.
    ``model``: None for the bundled all-MiniLM-L6-v2, or a model folder / hub id.
    """

    out: Path = DEFAULT_OUT
    model: str | None = None
    deadline_ms: float = CostConfig.deadline_ms
    memory_mb: float = CostConfig.memory_mb
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        self.cost()  # checks deadline_ms and memory_mb now, before any work

    def cost(self) -> CostConfig:
        return CostConfig(deadline_ms=self.deadline_ms, memory_mb=self.memory_mb, seed=self.seed)

    def to_dict(self) -> dict:
        return dict(asdict(self), out=str(self.out))


@dataclass(frozen=True)
class Lesson:
    config: LessonConfig
    sections: tuple[Section, ...]  # in the lesson's order, 1 to 8
    seconds: dict[str, float]  # wall time of each step
    elapsed_s: float
    # The captured "bank" maps, kept so the report can write the explorable viewer page beside
    # index.html; not part of lesson.json.
    maps: AttentionMaps | None = field(default=None, repr=False, compare=False)

    def section(self, key: str) -> Section:
        for s in self.sections:
            if s.key == key:
                return s
        raise LookupError(f"no section {key!r}; sections: {', '.join(s.key for s in self.sections)}")

    def to_dict(self) -> dict:
        from attnlab import __version__

        return {
            "schema_version": SCHEMA_VERSION,
            "attnlab_version": __version__,
            "config": self.config.to_dict(),
            "elapsed_s": self.elapsed_s,
            "seconds": self.seconds,
            "sections": [s.to_dict() for s in self.sections],
        }


Progress = Callable[[str, int, int], None]  # (what is starting, step number from 1, number of steps)


def run_lesson(config: LessonConfig = LessonConfig(), progress: Progress | None = None) -> Lesson:
    """Compute every section; ``progress`` is told before each step starts."""
    state: dict = {}

    def capture() -> None:
        state["maps"] = capture_bank(config.model)

    steps: list[tuple[str, str, Callable[[], Section | None]]] = [
        ("formula", "1. the formula and the scene", formula_section),
        ("qkv", "2. where Q, K and V come from", lambda: qkv_section(config.seed)),
        ("scaling", "3. why √d_k", lambda: scaling_section(config.seed)),
        ("capture", "loading the model, capturing the maps", capture),
        ("heads", "4. several heads", lambda: heads_section(model_info(state["maps"]))),
        ("maps", "5. the real maps", lambda: maps_section(state["maps"])),
        ("cost", "6. cost: measuring attention as n doubles", lambda: cost_section(config.cost())),
        ("next", "7. order blindness, the causal mask, a hidden token", lambda: next_section(config.seed)),
        ("transformer", "8. the transformer: an induction head being learned", lambda: transformer_section(config.seed)),
    ]
    sections, seconds = [], {}
    start = time.perf_counter()
    for i, (key, what, step) in enumerate(steps, 1):
        if progress:
            progress(what, i, len(steps))
        t0 = time.perf_counter()
        result = step()
        seconds[key] = time.perf_counter() - t0
        if result is not None:
            sections.append(result)
    sections.sort(key=lambda s: s.number)
    return Lesson(config, tuple(sections), seconds, time.perf_counter() - start, maps=state.get("maps"))
