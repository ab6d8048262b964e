"""Stage 3: a lowered Relax function -> the PrimitiveGraph (primitives, kinds, edges)."""
