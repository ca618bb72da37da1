"""Computations on attention maps only: head roles, the target-word head search, rollout and flow,
summaries of where heads look. Nothing here runs a model (that is :mod:`attnlab.interventions`)."""
