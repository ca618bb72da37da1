"""The maps data: one record per attention of a model (weights, and when captured its queries and
keys), word-level maps, and the maps file format (save/load). Nothing here runs a model."""
