"""Snapshots of a training job's state for the rollback fuse: the model's ``state_dict``,
the optimizer's, the LR scheduler's (when given) and the torch, CUDA, numpy and Python RNG
states, **copied** to CPU memory (never references to the live tensors) or written to disk.

:class:`Snapshot` is one copy, :class:`Ring` the bounded ring of them (oldest dropped
first). Sizes are measured from the tensors copied (``nbytes``), so the memory a ring holds
is known exactly; a snapshot on disk holds only its path in memory.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Ring", "Snapshot", "capture", "restore", "tensor_bytes"]


def _copy(obj: Any) -> Any:
    """A deep copy of ``obj`` whose tensors are new CPU tensors (detached)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy(v) for v in obj)
    return obj  # numbers, strings, None: immutable


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (dicts, lists and tuples walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


@dataclass
class Snapshot:
    """The job's state after optimizer step ``step`` (training resumes at ``step + 1``).

    ``state`` holds the copies (None when on disk: ``path``); ``bytes`` is what the copies
    of the model, optimizer and scheduler take (RNG states: a few KiB, not counted)."""

    step: int
    bytes: int
    state: dict[str, Any] | None = None
    path: str | None = None

    def load(self) -> dict[str, Any]:
        """The copies (read from disk if written there)."""
        if self.state is not None:
            return self.state
        assert self.path is not None
        # our own file, with numpy/python RNG states in it: not weights-only
        return torch.load(self.path, map_location="cpu", weights_only=False)

    def drop(self) -> None:
        """Free the copies (remove the file)."""
        self.state = None
        if self.path is not None:
            try:
                os.remove(self.path)
            except OSError:
                pass


def capture(step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
            scheduler: Any, *, lrs: list[float] | None = None,
            path: str | None = None, fuses: dict[str, Any] | None = None,
            tag: str = "rollback") -> Snapshot:
    """Copy the job's state now (after step ``step``'s update).

    ``path``: a directory to write the copy to (file ``{tag}-{pid}-{step}.pt``; the copy
    then holds no memory), else it stays in memory.

    ``lrs``: the scheduled learning rate of each param group, when something (the LR
    backoff) scales the groups' ``lr`` around the step: the copy keeps the schedule's.
    ``fuses``: what the fuses know about what they did to the weights then
    (``FuseSet.weight_states``), given back by :func:`restore`."""
    state: dict[str, Any] = {"model": _copy(model.state_dict())}
    if fuses:
        state["fuses"] = fuses
    if optimizer is not None:
        opt = optimizer.state_dict()
        state["optimizer"] = {"state": _copy(opt["state"]),
                              "param_groups": [_copy(g) for g in opt["param_groups"]]}
        if lrs is not None and len(lrs) == len(state["optimizer"]["param_groups"]):
            for group, lr in zip(state["optimizer"]["param_groups"], lrs, strict=True):
                group["lr"] = lr
    if scheduler is not None:
        state["scheduler"] = _copy(scheduler.state_dict())
    state["rng"] = _rng_state()
    size = tensor_bytes({k: v for k, v in state.items() if k not in ("rng", "fuses")})
    snap = Snapshot(step, size, state)
    if path is not None:
        os.makedirs(path, exist_ok=True)
        file = os.path.join(path, f"{tag}-{os.getpid()}-{step:09d}.pt")
        torch.save(state, file)
        snap.state, snap.path = None, file
    return snap


def restore(snap: Snapshot, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
            scheduler: Any, *, rng: bool = True) -> dict[str, Any] | None:
    """Put the job back to ``snap``: weights copied into the live parameters (their
    identity, so the optimizer's references, stays), the optimizer's state and groups,
    the scheduler's state, the RNG states (``rng=False``: left as they are). Returns the
    fuses' states taken with it."""
    state = snap.load()
    with torch.no_grad():
        model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        # load_state_dict casts and moves the state to each parameter's device; our copy
        # stays intact (it copies the tensors it is given)
        optimizer.load_state_dict(_copy(state["optimizer"]))
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(_copy(state["scheduler"]))
    if rng:
        _set_rng_state(state["rng"])
    return state.get("fuses")


@dataclass
class Ring:
    """At most ``keep`` snapshots, oldest dropped first."""

    keep: int
    items: list[Snapshot] = field(default_factory=list)

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def bytes(self) -> int:
        """Bytes the ring holds in memory (snapshots on disk: 0)."""
        return sum(s.bytes for s in self.items if s.state is not None)

    def add(self, snap: Snapshot) -> None:
        self.items.append(snap)
        while len(self.items) > self.keep:
            self.items.pop(0).drop()

    def pick(self, step: int, back: int) -> Snapshot | None:
        """The newest snapshot at least ``back`` steps before ``step``, else the oldest."""
        if not self.items:
            return None
        old = [s for s in self.items if step - s.step >= back]
        return old[-1] if old else self.items[0]

    def drop_after(self, step: int) -> None:
        """Drop the snapshots newer than ``step`` (a trajectory rolled back)."""
        keep = []
        for s in self.items:
            if s.step > step:
                s.drop()
            else:
                keep.append(s)
        self.items = keep

    def clear(self) -> None:
        for s in self.items:
            s.drop()
        self.items = []
