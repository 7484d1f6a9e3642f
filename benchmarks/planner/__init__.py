"""Is the layout planner right? Predicted against measured, and its GPU predictions: `python -m benchmarks.planner --help`."""
