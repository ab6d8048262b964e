"""korch_tvm: optimal kernel orchestration (Korch, ASPLOS'24) as a plugin for Apache TVM Relax."""

from .errors import KorchError

__all__ = ["KorchError"]
