"""Computing attention: ``attention()`` in front of several backends that agree with the spec.

:mod:`~attnlab.backends.api` holds ``attention()``; :mod:`~attnlab.backends.dispatch` which backend
serves a call (declared support, every refusal reason, auto's choice, measured by
:mod:`~attnlab.backends.calibrate`); :mod:`~attnlab.backends.request` the checked call. One module
per backend: ``numpy_ref`` (the float64 reference), ``eager`` (torch), ``sdpa``, ``blockwise`` (the
online-softmax loop, :mod:`~attnlab.backends.online` and :mod:`~attnlab.backends.tiling`) and
``kernel`` (the same compiled, with its C sources). :mod:`~attnlab.backends.agreement` is the one
table of agreement cases that ``attnlab check`` and the tests run.
"""
