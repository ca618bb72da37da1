"""attnlab on torch.distributed: ring attention (context parallelism) and statistics sharded over processes."""
