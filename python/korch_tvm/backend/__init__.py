"""Targets, CPU and CUDA schedules and builds, the plan -> Relax rewrite, verification."""
