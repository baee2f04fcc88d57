"""Fuses: the job acts on the warning (``attach(..., fuses=...)``; ``docs/FUSES.md``).

Off unless named. ``attach(model, opt, run=..., fuses=[QKClip(tau=50, mode="auto"),
LRBackoff(mode="suggest")])`` or ``fuses={"qk_clip": {"tau": 50, "mode": "auto"},
"lr_backoff": "suggest"}``; also ``QKNorm`` (temporary QK-norm) and ``SoftCap``. The
monitor's :class:`FuseSet` is ``mon.fuses``.
"""

from ._base import MODES, Event, Fuse, FusesArg, FuseSet
from ._base import parse as parse_fuses
from ._lr import LRBackoff
from ._qkclip import QKClip
from ._qknorm import QKNorm
from ._rollback import Rollback
from ._softcap import SoftCap

__all__ = ["MODES", "Event", "Fuse", "FuseSet", "FusesArg", "LRBackoff", "QKClip", "QKNorm",
           "Rollback", "SoftCap", "parse_fuses"]
