"""Reduce before sending: one frame per sampled step for a whole data-parallel group.

Data-parallel replicas measure the same layers and heads on different batches, so a job on
N ranks sending N frames repeats the per-head matrices N times. With reduction on (the
default when ``torch.distributed`` runs more than one rank, see :func:`find_reduce`),
every rank enters a few small collectives at the end of each sampled step, the group's
rank 0 (the *leader*) sends the one frame, and the other ranks send nothing unless the
collector asks for their own frames.

**What the leader's frame holds.**

* ``attn.logit_max``, ``attn.capped_logit_max``: the max over ranks (exact), and
  ``attn.logit_max_rank``: the global rank that held each head's max (the lowest such
  rank on a tie; -1 where no rank measured the head).
* ``attn.logit_p99`` (``attn.capped_logit_p99``): the max over ranks of each rank's p99.
  An upper bound of the pooled p99, never below it: with n logits per rank, the pooled
  top 1 % holds at most ``0.01 * N * n`` values, so some rank holds at least its share of
  them above the pooled p99, and that rank's p99 is >= the pooled p99. Over-reporting is
  bounded by the max (the bound lies between the pooled p99 and ``attn.logit_max``); when
  the ranks' distributions are alike it is the pooled value up to the spread of per-rank
  p99s.
* ``attn.logit_mean``, ``attn.logit_std``: pooled exactly, weighted by each rank's count of
  valid logits (sums of counts, of ``count * mean`` and of ``m2 + count * mean**2`` in
  float64), so the mean is the mean of means when the ranks' counts are equal.
* ``attn.entropy_mean``: pooled exactly over rows; ``attn.entropy_min``: the min over ranks.
* Per-head q/k norms, fuse values and every other scalar: the leader's own (the weights
  are replicas, the gradient norm, clip flag and lr are already global).
* Per-rank scalars gathered to the leader: for ``loss`` and the ``final.*`` statistics,
  one matrix ``ranks.<name>`` of shape 1 x world (column i: the group's rank i; NaN where a
  rank did not measure it, or measured NaN), and ``loss.ranks_mean``, ``loss.ranks_max``,
  ``loss.ranks_min``. The leader's own ``loss`` stays its own, as in its history.
* ``reduce.ranks``: the group's size; ``reduce.attn_ranks``: ranks that measured attention.

**Tensor parallelism** (:mod:`._tp`): where each rank computes ``H / tp`` heads of every
layer, it writes its statistics at its heads' place in a row of ``H``, the others' places
"missing" (MAX-neutral, zero counts), so the same collectives assemble the full layer x
head matrix while they reduce over the data-parallel replicas of each slice. The group
then spans the TP ranks too (the whole job by default).

The steps between samples travel in the leader's history only (its own loss; the gradient
norm, clip flag and lr are global under DDP and FSDP).

**Detail on demand.** The collector's ingest answer may hold ``control["detail_ranks"]``:
global ranks whose own frames it wants (e.g. while an alert names them). The leader puts at
most :data:`DETAIL_SLOTS` of them into the end-of-step agreement; a rank named there sends
its own unreduced frames (with its history since its last sampled step) from the next
sampled step on, until the leader's control no longer names it. The leader's own detail is
its reduced frame.

**Collectives** (sampled steps only, every rank, fixed order, whatever failed here; after
the sharded exchange of :mod:`._shard`, if any): one ``all_reduce(MAX)`` of a small int64
header (the attention layout), one ``all_reduce(MAX)`` of the packed maxima (int64: the
float's order-preserving bits in the high half and the rank in the low half, so one
collective gives both the max and who held it), one ``all_reduce(SUM)`` (float64) of the
pooled sums and the gathered scalars, and, in place of the sharded exchange's interval
agreement, one ``all_reduce(MAX)`` of ``[interval, requested sample, the leader's control
sample_every, budget floor, detail ranks...]`` (over the sharding group too where it is
wider, :func:`find_reduce`):
a rank's request to sample the next step (a spike, ``request_sample``) waits for that
agreement, so every rank samples the same steps. Two host reads per sampled step (the
header and the agreement). A rank whose attention failed contributes "missing" marks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from logitwatch.wire import CONTROL_DETAIL_RANKS, RANK_OF_MAX

from ._logits import HeadStats
from ._tp import TensorParallel

__all__ = ["CONTROL_KEY", "DETAIL_SLOTS", "GATHERED", "RankReduce", "Reduced", "find_reduce",
           "pack", "unpack"]

log = logging.getLogger("logitwatch.hooks")

#: The control key that names the ranks asked for their own frames.
CONTROL_KEY = CONTROL_DETAIL_RANKS
#: At most this many ranks send their own frames at once.
DETAIL_SLOTS = 8
#: Per-rank scalars gathered to the leader (``ranks.<name>``).
GATHERED = ("loss", "final.hidden_rms", "final.logz", "final.logit_max")
_MISSING = -(2**63)
_LOW = 1 << 32


def pack(x: torch.Tensor, rank: int) -> torch.Tensor:
    """float32 values -> int64 keys ordered as the values (NaN above +inf), rank in the low
    32 bits so that a ``MAX`` keeps the lowest rank among equal values."""
    x = x.float()
    x = torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x)
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    key = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)
    return key * _LOW + (_LOW - 1 - rank)


def unpack(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack`: ``(values float32, ranks int64)``; a missing key (no rank
    contributed) gives NaN and rank -1."""
    missing = p == _MISSING
    key = torch.div(p, _LOW, rounding_mode="floor")
    tag = p - key * _LOW
    bits = torch.where(key >= 0, key, (-key - 1) - (1 << 31))
    value = bits.to(torch.int32).view(torch.float32)
    value = torch.where(missing, torch.full_like(value, float("nan")), value)
    rank = torch.where(missing, torch.full_like(tag, -1), _LOW - 1 - tag)
    return value, rank


@dataclass
class Reduced:
    """The group's reduced values of one sampled step, on the device (every rank has them).

    ``heads`` replaces the frame's ``attn.*`` matrices; ``scalars`` (leader only) are added.
    """

    heads: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)

    def apply(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]) -> None:
        """Put the reduced values into a frame's (device) scalars and heads, in place."""
        if any(n.startswith("attn.") for n in self.heads):
            # the group's attention replaces this rank's own; where the ranks' layouts
            # disagreed there is none (only the gathered ``ranks.*``), and the sender's own
            # attention statistics stay, as the layout warning says
            for name in [n for n in heads if n.startswith("attn.")]:
                del heads[name]
        heads.update(self.heads)
        scalars.update(self.scalars)


class RankReduce:
    """The group's reduction, rank and detail state; see the module docstring."""

    def __init__(self, group: Any, device: torch.device,
                 tp: TensorParallel | None = None) -> None:
        import torch.distributed as dist

        #: Where this rank's heads sit in each layer's row (tensor parallel), or None.
        self.tp = tp

        self._dist = dist
        self.group = group
        self.world = int(dist.get_world_size(group))
        self.group_rank = int(dist.get_rank(group))
        self.rank = int(dist.get_rank())  # global: what frames and the collector say
        self.device = device
        self.leader = self.group_rank == 0
        #: Whether this rank sends frames (the leader; a rank in detail mode).
        self.sends = self.leader
        #: Whether this rank sends its own unreduced frames (detail mode).
        self.detail = False
        #: Host reads per sampled step that wait for the device (an accelerator only).
        self.syncs = 0 if device.type == "cpu" else 2
        #: Whether the sharding group is wider than this group (``find_reduce``): the
        #: agreed schedule is then agreed over it too (``Sharding.agree_schedule``).
        self.agree_shard = False

    # -- the end-of-step agreement ------------------------------------------------------

    def agree(self, proposal: int, force: bool, control: Mapping[str, Any],
              floor: int = 1) -> tuple[int, bool]:
        """Every rank, end of a sampled step: the next interval, whether some rank asked
        to sample the next step, and which ranks send their own frames (the leader's
        ``control``). One ``all_reduce(MAX)``.

        The interval is the widest ``proposal`` unless the leader's collector asks for one
        (``control["sample_every"]``: only the leader hears the collector's answers): that
        one then overrides every rank's requested interval, still widened as far as the
        widest ``floor`` (what each rank's overhead budget needs), so the collector can make
        the job sample more often as well as less."""
        slots = [-1] * DETAIL_SLOTS
        asked_every = -1
        if self.leader and isinstance(control, Mapping):
            every = control.get("sample_every")
            if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
                asked_every = min(every, 2**62)
        if self.leader:
            asked = control.get(CONTROL_KEY) if isinstance(control, Mapping) else None
            if isinstance(asked, list):
                ok = [r for r in asked if isinstance(r, int) and not isinstance(r, bool)
                      and 0 <= r < 2**31 and r != self.rank]
                for i, r in enumerate(sorted(set(ok))[:DETAIL_SLOTS]):
                    slots[i] = r
        t = torch.tensor([int(proposal), int(bool(force)), asked_every, max(1, int(floor)),
                          *slots], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        values = t.tolist()
        self.detail = not self.leader and self.rank in values[4:]
        self.sends = self.leader or self.detail
        interval = values[0] if values[2] < 1 else max(values[2], values[3])
        return max(1, int(interval)), bool(values[1])

    # -- the reduction ------------------------------------------------------------------

    def reduce(self, attn: Mapping[int, HeadStats], scalars: Mapping[str, Any],
               warn: Callable[[str, str], None]) -> Reduced | None:
        """Every rank, end of a sampled step: reduce ``attn`` (this rank's per-layer
        statistics) and gather ``scalars``' :data:`GATHERED` values. Always enters the same
        collectives as the other ranks; None when a collective failed."""
        layers = sorted(attn)
        try:
            header = _header(attn, layers, scalars, self.tp)
        except Exception:
            warn("reduce-local", "this rank's attention statistics could not be reduced")
            layers, header = [], _header({}, [], {}, self.tp)
        t = torch.tensor(header, dtype=torch.int64, device=self.device)
        try:
            self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
            agreed = t.tolist()
        except Exception:
            warn("reduce", "the end-of-step reduction across ranks failed")
            return None
        n_layers, width, capped, check = agreed[:4]
        measured = agreed[8:]
        same = agreed[4] != _MISSING and [-v for v in agreed[4:8]] == agreed[:4]
        if not same:
            if agreed[4] != _MISSING:
                warn("reduce-layout", "the ranks measured different attention layouts; "
                     "each frame keeps its sender's own attention statistics")
            n_layers = width = 0
        mine = same and header[:4] == agreed[:4]
        cells = n_layers * width
        n_max = (5 if capped else 3) * cells
        n_sum = 5 * cells + 1 + 2 * self.world * len(GATHERED)
        try:
            packed = torch.full((n_max,), _MISSING, dtype=torch.int64, device=self.device)
            sums = torch.zeros(n_sum, dtype=torch.float64, device=self.device)
            if mine and cells:
                try:
                    self._put_attn(attn, layers, width, bool(capped), packed, sums)
                    sums[5 * cells] = 1.0
                except Exception:
                    packed.fill_(_MISSING)
                    sums[: 5 * cells + 1].zero_()
                    warn("reduce-local", "this rank's attention statistics could not be "
                         "reduced")
            try:
                self._put_scalars(scalars, sums, 5 * cells + 1)
            except Exception:
                warn("reduce-scalars", "this rank's scalars could not be gathered")
        except Exception:  # allocation: still enter the collectives, with fresh vectors
            packed = torch.full((n_max,), _MISSING, dtype=torch.int64, device=self.device)
            sums = torch.zeros(n_sum, dtype=torch.float64, device=self.device)
        try:
            if n_max:
                self._dist.all_reduce(packed, op=self._dist.ReduceOp.MAX, group=self.group)
            self._dist.all_reduce(sums, group=self.group)
        except Exception:
            warn("reduce", "the end-of-step reduction across ranks failed")
            return None
        try:
            out = Reduced()
            if cells:
                out.heads = _attn_metrics(packed, sums, n_layers, width, bool(capped))
                if self.leader:
                    out.scalars["reduce.attn_ranks"] = sums[5 * cells]
            if self.leader:
                out.scalars["reduce.ranks"] = float(self.world)
                self._gathered(sums[5 * cells + 1:], measured, out)
            return out
        except Exception:
            warn("reduce-result", "the reduced values could not be read")
            return None

    def _put_attn(self, attn: Mapping[int, HeadStats], layers: list[int], width: int,
                  capped: bool, packed: torch.Tensor, sums: torch.Tensor) -> None:
        cells = len(layers) * width
        maxes = [("maximum", 1.0), ("p99", 1.0), ("ent_min", -1.0)]
        if capped:
            maxes += [("capped_max", 1.0), ("capped_p99", 1.0)]
        view = packed.view(len(maxes), len(layers), width)
        sview = sums[: 5 * cells].view(5, len(layers), width)
        for i, layer in enumerate(layers):
            s = attn[layer]
            h = s.maximum.numel()
            a = h * self.tp.rank if self.tp is not None else 0  # this rank's heads
            b = a + h
            for j, (name, sign) in enumerate(maxes):
                v = getattr(s, name).reshape(-1).to(self.device).float() * sign
                if name == "ent_min":  # a head without rows has no entropy
                    has = s.rows.reshape(-1).to(self.device) > 0
                    view[j, i, a:b] = torch.where(has, pack(v, self.rank),
                                                  torch.full_like(view[j, i, a:b], _MISSING))
                else:
                    view[j, i, a:b] = pack(v, self.rank)
            count = s.count.reshape(-1).to(self.device).double()
            mean = torch.where(count > 0, s.mean.reshape(-1).to(self.device).double(),
                               torch.zeros_like(count))
            m2 = torch.where(count > 0, s.m2.reshape(-1).to(self.device).double(),
                             torch.zeros_like(count))
            sview[0, i, a:b] = count
            sview[1, i, a:b] = count * mean
            sview[2, i, a:b] = m2 + count * mean * mean
            sview[3, i, a:b] = s.rows.reshape(-1).to(self.device).double()
            sview[4, i, a:b] = s.ent_sum.reshape(-1).to(self.device).double()

    def _put_scalars(self, scalars: Mapping[str, Any], sums: torch.Tensor, start: int) -> None:
        n = len(GATHERED)
        values = sums[start : start + self.world * n].view(self.world, n)
        present = sums[start + self.world * n :].view(self.world, n)
        for j, name in enumerate(GATHERED):
            v = scalars.get(name)
            if v is None:
                continue
            if isinstance(v, torch.Tensor):
                values[self.group_rank, j] = v.detach().float().mean().to(self.device).double()
            else:
                values[self.group_rank, j] = float(v)
            present[self.group_rank, j] = 1.0

    def _gathered(self, part: torch.Tensor, measured: list[int], out: Reduced) -> None:
        n = len(GATHERED)
        values = part[: self.world * n].view(self.world, n)
        present = part[self.world * n :].view(self.world, n)
        for j, name in enumerate(GATHERED):
            if not measured[j]:
                continue  # no rank measured it
            has = present[:, j] > 0
            col = values[:, j]
            out.heads[f"ranks.{name}"] = [
                torch.where(has, col, torch.full_like(col, float("nan"))).float()]
            if name == "loss":  # a NaN loss on some rank makes these NaN: a signal
                count = has.sum().clamp(min=1)
                out.scalars["loss.ranks_mean"] = (
                    torch.where(has, col, torch.zeros_like(col)).sum() / count).float()
                out.scalars["loss.ranks_max"] = torch.where(
                    has, col, torch.full_like(col, float("-inf"))).max().float()
                out.scalars["loss.ranks_min"] = torch.where(
                    has, col, torch.full_like(col, float("inf"))).min().float()


def _header(attn: Mapping[int, HeadStats], layers: list[int],
            scalars: Mapping[str, Any], tp: TensorParallel | None = None) -> list[int]:
    """``[layers, width, capped, checksum]``, their negations (one MAX gives both the
    largest and the smallest; a rank without attention says nothing: MAX-neutral), then
    whether this rank measured each of :data:`GATHERED`. Widths are the full rows' under
    tensor parallelism (``tp.size`` times this rank's heads)."""
    present = [int(scalars.get(name) is not None) for name in GATHERED]
    if not layers:
        return [0, 0, 0, 0] + [_MISSING] * 4 + present
    widths = [attn[layer].maximum.numel() * (tp.size if tp is not None else 1)
              for layer in layers]
    capped = int(all(attn[layer].capped_max is not None and attn[layer].capped_p99 is not None
                     for layer in layers))
    head = [len(layers), max(widths), capped, _checksum(layers, widths)]
    return head + [-v for v in head] + present


#: A prime below 2**61 and a base for :func:`_checksum` (fixed: every rank computes alike).
_PRIME = (1 << 61) - 1
_BASE = 1_000_003


def _checksum(layers: list[int], widths: list[int]) -> int:
    """A position-sensitive hash of the ``(layer, width)`` sequence, in ``[0, 2**61)``: a
    polynomial hash modulo a Mersenne prime, so that different layer sets (``{0, 3}`` and
    ``{1, 2}``, whose sums agree) or widths give different checksums but by a ~2**-61
    chance. Deterministic across processes (no ``hash()``)."""
    h = len(layers) + 1
    for layer, width in zip(layers, widths, strict=True):
        h = (h * _BASE + int(layer) + 1) % _PRIME
        h = (h * _BASE + int(width) + 1) % _PRIME
    return h


def _attn_metrics(packed: torch.Tensor, sums: torch.Tensor, n_layers: int, width: int,
                  capped: bool) -> dict[str, list[torch.Tensor]]:
    cells = n_layers * width
    nan = float("nan")
    groups = 5 if capped else 3
    values, ranks = unpack(packed.view(groups, n_layers, width))
    s = sums[: 5 * cells].view(5, n_layers, width)
    count, total, squares, rows, ent = s[0], s[1], s[2], s[3], s[4]
    has = count > 0
    safe = count.clamp(min=1)
    mean = total / safe
    var = (squares / safe - mean * mean).clamp(min=0)
    out = {
        "attn.logit_max": values[0],
        RANK_OF_MAX: torch.where(ranks[0] >= 0, ranks[0].double(),
                                           torch.full_like(ranks[0], -1).double()),
        "attn.logit_p99": values[1],
        "attn.logit_mean": torch.where(has, mean, torch.full_like(mean, nan)),
        "attn.logit_std": torch.where(has, var.sqrt(), torch.full_like(var, nan)),
        "attn.entropy_mean": torch.where(rows > 0, ent / rows.clamp(min=1),
                                         torch.full_like(ent, nan)),
        "attn.entropy_min": -values[2],
    }
    if capped:
        out["attn.capped_logit_max"] = values[3]
        out["attn.capped_logit_p99"] = values[4]
    return {name: [row.float() for row in m] for name, m in out.items()}


def find_reduce(arg: Any, device: torch.device, shard: Any = None,
                tp: TensorParallel | None = None) -> RankReduce | None:
    """The reduction ``attach(reduce_ranks=arg)`` asks for, or None (every rank sends its
    own frames).

    ``None`` (default): on when ``torch.distributed`` is initialised with more than one rank,
    over the whole job, except for DTensor parameters on a mesh of more than one dimension
    with no tensor-parallel placement found (``tp``; pipeline parallel: layers differ by
    rank; pass the data-parallel group); ``True``: on over the whole job; ``False``: off; a
    process group: on over it. Decide alike on every rank.

    A process group is checked at attach, by one ``all_reduce(MAX)`` over it (every member
    decides alike): with tensor parallelism (``tp``) it must hold each member's whole TP
    group (the data-parallel group does not: its ranks hold one slice of the heads each,
    and each TP rank's group would have its own leader sending a half-missing matrix);
    with sharding (``shard``) the sharding group must be within it, or be the whole job
    (then the agreed schedule is agreed over the whole job too: ``agree_shard``). Otherwise
    reduction is off, with a warning, and every rank sends its own frames.
    """
    if arg is False:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    group = None if arg is None or arg is True else arg
    if arg is None and tp is None and shard is not None and shard.dtensor and shard.group is None:
        log.info("logitwatch: parameters on a multi-dimensional device mesh: every rank sends "
                 "its own frames (attach(reduce_ranks=<data-parallel group>) reduces them)")
        return None
    if dist.get_world_size(group) < 2:
        return None
    red = RankReduce(group, device, tp)
    if group is not None and (shard is not None or tp is not None):
        return _check_group(red, shard, tp)
    return red


def _check_group(red: RankReduce, shard: Any, tp: TensorParallel | None) -> RankReduce | None:
    """The attach-time check of an explicit reduce group (see :func:`find_reduce`)."""
    dist = red._dist
    members = set(dist.get_process_group_ranks(red.group))
    wide = cross = tp_out = 0
    if shard is not None:
        inner = shard.group
        if inner is None:  # the whole job
            wide = int(int(dist.get_world_size()) > len(members))
        elif not set(dist.get_process_group_ranks(inner)) <= members:
            cross = 1  # a sharding group across reduce groups: the schedules cannot agree
    if tp is not None and tp.members is not None and not set(tp.members) <= members:
        tp_out = 1
    t = torch.tensor([wide, cross, tp_out], dtype=torch.int64, device=red.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=red.group)
    wide, cross, tp_out = t.tolist()
    if tp_out:
        log.warning("logitwatch: ranks not reduced: under tensor parallelism the reduce_ranks "
                    "group must hold each rank's whole tensor-parallel group (pass the "
                    "default or True: the whole job, or a group of whole TP groups), not the "
                    "data-parallel group; every rank sends its own frames (its own heads)")
        return None
    if cross:
        log.warning("logitwatch: ranks not reduced: the reduce_ranks group does not hold the "
                    "sharding group of one of its ranks, so the two could not sample the "
                    "same steps; every rank sends its own frames")
        return None
    red.agree_shard = bool(wide)
    return red
