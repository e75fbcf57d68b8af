"""The tagging stage: per-step tags (tokens, padding, length bucket, content cluster, entropy, run lengths)."""
