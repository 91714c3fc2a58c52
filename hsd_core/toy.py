"""The toy world in one namespace: vocabularies, tokenizers and model families."""

from .models import (
    CharSource,
    FunctionModel,
    InducedModel,
    RandomModel,
    RelabeledModel,
    TableModel,
    induced_model,
    point_law,
    random_model,
    relabeled,
    uniform_law,
)
from .tokenizers import BPETokenizer, LongestMatchTokenizer
from .vocab import Vocabulary

__all__ = [
    "BPETokenizer", "CharSource", "FunctionModel", "InducedModel", "LongestMatchTokenizer",
    "RandomModel", "RelabeledModel", "TableModel", "Vocabulary", "induced_model", "point_law",
    "random_model", "relabeled", "uniform_law",
]
