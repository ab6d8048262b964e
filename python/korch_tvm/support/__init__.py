"""Shared helpers of every stage: memos, topological order, interrupts, safe output files."""
