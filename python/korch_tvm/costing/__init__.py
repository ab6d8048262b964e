"""Stage 5: kernels -> KernelCosts: tuning log, measurement, tuning, cost model."""
