"""Primitive-graph substitutions (Korch's TASO-style optimizer), offered as alternatives."""
