"""The measuring harness: time and memory of attention as the context grows (`attnlab bench`, the lesson's cost section).

- :mod:`attnlab.bench.timing`: probes of peak memory, the interleaved timing rounds, thread settings;
- :mod:`attnlab.bench.methods`: the methods compared (``METHODS``) and a call computing each;
- :mod:`attnlab.bench.sweep`: :class:`BenchConfig`, :func:`run`, :func:`measure_sweep`, the results
  and the machine they were measured on;
- :mod:`attnlab.bench.checkup`: what ``attnlab check`` adds to the agreement table (the kernel's
  build, auto's measured choices).
"""

from attnlab.bench.methods import METHODS, flops
from attnlab.bench.sweep import BenchConfig, BenchResult, Measurement, machine, measure, measure_sweep, run

__all__ = ["METHODS", "BenchConfig", "BenchResult", "Measurement", "flops", "machine", "measure", "measure_sweep", "run"]
