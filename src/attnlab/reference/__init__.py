"""The specification of attention, in NumPy float64: softmax and reference attention, masks,
multi-head and additive attention, and the argument checks every backend shares. Every backend is
tested against it."""
