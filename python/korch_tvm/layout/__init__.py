"""Activation layouts (NCHW / NHWC) chosen per region of the graph."""
