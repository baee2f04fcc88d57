"""Float32 blob codec for stored values (little-endian, row-major)."""

from __future__ import annotations

import numpy as np

__all__ = ["decode", "encode"]

_F32 = np.dtype("<f4")


def encode(values: list[float] | list[list[float]]) -> bytes:
    return np.asarray(values, dtype=_F32).tobytes()


def decode(data: bytes, layers: int = 0, heads: int = 0) -> np.ndarray:
    arr = np.frombuffer(data, dtype=_F32)
    return arr.reshape(layers, heads) if layers and heads else arr
