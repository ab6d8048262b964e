"""Stage 4: the PrimitiveGraph -> candidate kernels under per-target kernel rules."""
