"""The context planner: will this model, at this context length, on this hardware, meet the deadline and fit?

``attnlab.plan(model, hardware="this", prompt_tokens=…, new_tokens=…)`` predicts the time to the first
token, the time per output token and the memory of serving a model, term by term
(:mod:`attnlab.planner.predict`), from the model's shapes (:mod:`attnlab.planner.models`: a config.json
or a bundled architecture), pure counts (:mod:`attnlab.planner.formulas`) and rates: measured on this
machine (:mod:`attnlab.planner.machine`) or a datasheet times stated efficiencies
(:mod:`attnlab.planner.hardware`). The largest length meeting the limits comes from the one search
(:mod:`attnlab.planner.search`) that ``attnlab cost`` uses too.
"""

from attnlab.planner.api import Plan, Row, plan
from attnlab.planner.hardware import ACCELERATORS, Efficiencies, Hardware, accelerator
from attnlab.planner.models import BUNDLED, Architecture, load_model
from attnlab.planner.search import Search, largest_length

__all__ = ["ACCELERATORS", "BUNDLED", "Architecture", "Efficiencies", "Hardware", "Plan", "Row", "Search",
           "accelerator", "largest_length", "load_model", "plan"]
