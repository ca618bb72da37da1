"""The lesson of ../shared/seeds: the scene, the experiments, the cost model, the report."""
