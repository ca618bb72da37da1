"""The math of attention: the NumPy specification, masks, multi-head and additive attention."""
