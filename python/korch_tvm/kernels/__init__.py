"""Groups of primitives -> fused kernel PrimFuncs: structural keys, kinds, weight packing."""
