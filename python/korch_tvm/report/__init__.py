"""Reports as text, the plan drawn (HTML/SVG, DOT), the benchmark plot."""
