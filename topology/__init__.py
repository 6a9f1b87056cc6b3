"""Topologies (networkx), buddy chunk trees, DP operators and machine discovery."""

from topology.chunks import (
    Chunk,
    ChunkTree,
    buddy,
    build_chunk_graph,
    chunk_level,
    chunk_sizes,
    enclosing,
    is_aligned,
    is_pow2,
    pow2_floor,
)
from topology.cpu import CpuNode
from topology.discovery import GpuDiscovery, GpuInfo, discover_gpus, discover_numa, parse_cpulist
from topology.errors import InvariantViolation, TopologyError
from topology.operators import ChunkOperator, FlatOperator

__all__ = [
    "Chunk",
    "ChunkOperator",
    "ChunkTree",
    "CpuNode",
    "FlatOperator",
    "GpuDiscovery",
    "GpuInfo",
    "InvariantViolation",
    "TopologyError",
    "buddy",
    "build_chunk_graph",
    "chunk_level",
    "chunk_sizes",
    "discover_gpus",
    "discover_numa",
    "enclosing",
    "is_aligned",
    "is_pow2",
    "parse_cpulist",
    "pow2_floor",
]
