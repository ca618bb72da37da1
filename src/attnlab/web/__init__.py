"""The local web viewer's server: the FastAPI app, its worker pool and cache, the host guard and
the API's request and response models. The pages and figures it serves are :mod:`attnlab.viz`'s."""
