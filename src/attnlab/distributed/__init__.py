"""attnlab on torch.distributed: ring attention (context parallelism) and statistics sharded over processes.

``import attnlab.distributed`` needs NumPy only; torch is imported by the calls that use it.
"""

from attnlab.distributed.env import all_reduce_sum, init_from_env, rank_and_world, shard_items
from attnlab.distributed.launch import run_local
from attnlab.distributed.layout import shard, shard_lengths, unshard
from attnlab.distributed.ring import ring_attention

__all__ = [
    "all_reduce_sum",
    "init_from_env",
    "rank_and_world",
    "ring_attention",
    "run_local",
    "shard",
    "shard_items",
    "shard_lengths",
    "unshard",
]
