"""Reliability: resume across layouts, failing nodes, hostile inputs at full size, memory over a long run."""
