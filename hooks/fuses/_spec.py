"""The ``attach(fuses=...)`` argument: :data:`FusesArg` and :func:`parse`, which turns it
into fuse objects (the known fuses by name, with a mode or their options)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._fuse import Fuse

__all__ = ["FusesArg", "parse"]

#: ``attach(fuses=...)``: fuse objects, or ``{name: mode | {option: value}}``.
FusesArg = Sequence["Fuse"] | Mapping[str, "str | Mapping[str, Any]"]


def parse(spec: FusesArg | None) -> list[Fuse]:
    """Fuse objects from ``attach(fuses=...)`` (see :data:`FusesArg`)."""
    from ._lr import LRBackoff
    from ._qkclip import QKClip
    from ._qknorm import QKNorm
    from ._rollback import Rollback
    from ._softcap import SoftCap

    known: dict[str, type[Fuse]] = {QKClip.name: QKClip, LRBackoff.name: LRBackoff,
                                    Rollback.name: Rollback, QKNorm.name: QKNorm,
                                    SoftCap.name: SoftCap}
    if spec is None:
        return []
    out: list[Fuse] = []
    if isinstance(spec, Mapping):
        for name, options in spec.items():
            if name not in known:
                raise ValueError(f"attach: unknown fuse {name!r}; known: {sorted(known)}")
            if isinstance(options, str):
                out.append(known[name](mode=options))
            elif isinstance(options, Mapping):
                out.append(known[name](**dict(options)))
            else:
                raise TypeError(f"attach: fuses[{name!r}] must be a mode or a dict of "
                                f"options, got {options!r}")
    elif isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        for fuse in spec:
            if not isinstance(fuse, Fuse):
                raise TypeError(f"attach: fuses must be Fuse objects, got {fuse!r}")
            out.append(fuse)
    else:
        raise TypeError(f"attach: fuses must be a list of fuses or a mapping, got {spec!r}")
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ValueError(f"attach: a fuse is named twice in {names}")
    return out
