"""A transformer built from attnlab's parts (embeddings, positions, blocks, norms, FFN), loading real weights from safetensors."""
