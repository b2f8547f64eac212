"""The six interfaces that implementations plug into.

Each module defines one abstract class and the plain data it exchanges; implementations live in
tileinfer.plugins (built in) or in third-party packages, and are selected by name in the config.
"""

from tileinfer.interfaces.attention import Attention, AttentionSpec, RopeTable, Step
from tileinfer.interfaces.forward import ForwardPass
from tileinfer.interfaces.kv_store import KVGeometry, KVStore, LayerKV
from tileinfer.interfaces.linear import EPILOGUES, Linear, RMSNorm
from tileinfer.interfaces.pluggable import Pluggable, RunSpec
from tileinfer.interfaces.proposer import DeviceSequence, Draft, Proposer, ProposerContext
from tileinfer.interfaces.sampler import Sample, Sampler, SamplingParams, TokenHistory

__all__ = [
    "Attention",
    "AttentionSpec",
    "DeviceSequence",
    "Draft",
    "EPILOGUES",
    "ForwardPass",
    "KVGeometry",
    "KVStore",
    "LayerKV",
    "Linear",
    "Proposer",
    "ProposerContext",
    "Pluggable",
    "RMSNorm",
    "RopeTable",
    "RunSpec",
    "Sample",
    "Sampler",
    "SamplingParams",
    "Step",
    "TokenHistory",
]
