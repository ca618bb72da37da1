"""The lesson on attention, computed: the scene, the experiments, the cost model, the report."""
