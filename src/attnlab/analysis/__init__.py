"""Word-level aggregation, head roles, target-word head search, corpus statistics."""
