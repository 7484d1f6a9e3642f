"""Data preparation at scale, the TMX reader, batching of patent-length sentences."""
