"""Finding each attention module's query/key projections, and saying what was found.

Layouts, tried in this order on every module (the *owner*: the attention module):

* ``nn.MultiheadAttention``: ``in_proj_weight`` rows (or ``q/k_proj_weight``);
* an explicit ``attach(qk_layout=...)`` entry for one of its children (below);
* a **fused** q/k/v projection child named ``c_attn``, ``qkv_proj``, ``qkv``, ``Wqkv``,
  ``to_qkv`` or ``qkv_linear``: an ``nn.Linear`` (weight ``(out, in)``: q/k/v
  along the rows) or GPT-2's ``Conv1D`` (weight ``(in, out)``, an ``nf`` attribute: along the
  columns), laid out ``[q | k | v]`` with ``q`` = ``H·D`` and ``k``, ``v`` = ``H_kv·D`` each
  (nanoGPT, GPT-2, Phi-3 with GQA, timm ViT, most hand-written models). The geometry comes
  from the owner's (or its ``config``'s) usual attributes (``n_head``/``num_heads``/
  ``num_attention_heads``..., ``num_key_value_heads``/``n_kv_head``..., ``head_dim``, or
  ``n_embd``/``embed_dim``/``hidden_size``...) when they determine it and the output size
  splits that way; otherwise it is read from the **first sampled forward**: the first
  attention call after the projection ran gives ``H``, ``H_kv`` and ``D`` (its ``q`` and
  ``k`` shapes), accepted when the output size is ``(H + 2·H_kv)·D`` (not under sharding,
  whose layout is fixed at attach). When no measured attention call follows it in
  :data:`GIVE_UP_AFTER` sampled steps, discovery stops waiting and logs why;
* separate projections: ``q_proj``/``k_proj``, ``query``/``key``, ``wq``/``wk``,
  ``to_q``/``to_k``, ``q``/``k`` (``nn.Linear``; the head size from the owner's attributes).

``query_key_value`` (GPT-NeoX, Falcon, Bloom) interleaves heads (``[q_h k_h v_h]`` per head),
which the shape alone cannot tell from ``[q | k | v]``: it is named in the report, not read.

``attach(qk_layout={name: {"heads": H, "kv_heads": H_kv, "head_dim": D}})`` maps a fused
projection (its name in ``model.named_modules()``, or its last part to match every
module of that name) to its geometry; ``kv_heads`` defaults to ``heads``, ``head_dim`` to
what the output size implies. ``{name: None}`` turns q/k norms off for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._qk import Part, QKSource, ShapeOf

__all__ = ["Found", "Pending", "QKDiscovery", "QKLayout", "find", "find_qk", "report", "resolve"]

log = logging.getLogger("logitwatch.hooks")

#: Names of fused q/k/v projections laid out [q | k | v].
FUSED = ("c_attn", "qkv_proj", "qkv", "Wqkv", "to_qkv", "qkv_linear")
#: Sampled steps whose forward ran a pending fused projection but measured no attention
#: call, after which discovery gives up on it (its hooks removed, logged once): its
#: attention is not one the capture sees (hand-written, a custom kernel), and a hook that
#: waited for ever would run on every sampled forward of the run.
GIVE_UP_AFTER = 3
#: Names of separate q/k projection pairs.
SEPARATE = (("q_proj", "k_proj"), ("query", "key"), ("wq", "wk"), ("to_q", "to_k"),
            ("q", "k"))
_HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_head", "n_kv_heads", "kv_heads")
_HEAD_DIM = ("head_dim", "attention_head_size", "head_size", "d_head")
_EMBED = ("embed_dim", "n_embd", "hidden_size", "d_model", "dim")

#: ``attach(qk_layout=)``: fused projection name -> geometry (or None: off).
QKLayout = Mapping[str, "Mapping[str, int] | None"]


@dataclass
class Pending:
    """A fused projection whose geometry the first sampled forward will tell."""

    index: int  # the owner's position in module order (the q/k rows' order)
    owner: nn.Module
    proj: nn.Module
    name: str
    axis: int
    size: int  # its output size
    geometry: tuple[int, int, int] | None = None  # (H, H_kv, D), from the capture


@dataclass
class Found:
    """What discovery found: the sources (with their module-order index), the pending
    fused projections, and one report entry per attention module."""

    sources: list[tuple[int, QKSource]] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    entries: list[tuple[str, str, bool]] = field(default_factory=list)  # class, how, has qk

    def ordered(self) -> list[QKSource]:
        return [src for _, src in sorted(self.sources, key=lambda item: item[0])]


def _part(owner: nn.Module, name: str, axis: int = 0, start: int = 0,
          stop: int | None = None) -> Part | None:
    t = getattr(owner, name, None)
    return Part(t, axis, start, stop, owner, name) if isinstance(t, torch.Tensor) else None


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def _head_dim(module: nn.Module, q_out: int) -> int | None:
    hd = _int(getattr(module, "head_dim", None)) or _int(
        getattr(module, "attention_head_size", None))
    if hd:
        return hd
    config = getattr(module, "config", None)
    hd = _int(getattr(config, "head_dim", None))
    if hd:
        return hd
    heads = (_int(getattr(module, "num_heads", None))
             or _int(getattr(module, "num_attention_heads", None))
             or _int(getattr(config, "num_attention_heads", None)))
    return q_out // heads if heads and q_out % heads == 0 else None


def no_shape(owner: nn.Module, name: str) -> torch.Size | None:
    return None


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    config = getattr(module, "config", None)
    for obj in (module, config):
        for name in names:
            value = _int(getattr(obj, name, None)) if obj is not None else None
            if value:
                return value
    return None


def _geometry(owner: nn.Module, size: int) -> tuple[int, int, int] | None:
    """``(H, H_kv, D)`` from the owner's attributes, if they determine it and ``size``
    splits as ``(H + 2·H_kv)·D``."""
    heads = _attr(owner, _HEADS)
    if not heads:
        return None
    kv = _attr(owner, _KV_HEADS)
    groups = _int(getattr(owner, "num_key_value_groups", None))
    if not kv and groups and heads % groups == 0:
        kv = heads // groups
    hd = _attr(owner, _HEAD_DIM)
    if not hd:
        embed = _attr(owner, _EMBED)
        if kv:
            hd = size // (heads + 2 * kv) if size % (heads + 2 * kv) == 0 else None
        elif embed and embed % heads == 0:
            hd = embed // heads
    if not hd:
        return None
    if not kv:
        rest = size - heads * hd
        kv = rest // (2 * hd) if rest > 0 and rest % (2 * hd) == 0 else None
    return (heads, kv, hd) if kv and (heads + 2 * kv) * hd == size else None


def _fused_source(proj: nn.Module, axis: int, geometry: tuple[int, int, int]) -> QKSource:
    heads, kv, hd = geometry
    w = proj.weight
    q, k = heads * hd, heads * hd + kv * hd
    return QKSource("rows" if axis == 0 else "cols",
                    Part(w, axis, 0, q, proj, "weight"), Part(w, axis, q, k, proj, "weight"),
                    _part(proj, "bias", 0, 0, q), _part(proj, "bias", 0, q, k), hd)


def _fused_axis(proj: nn.Module, shape_of: ShapeOf) -> tuple[int, int] | None:
    """``(axis, output size)`` of a fused projection's weight, or None (not a 2-D
    ``Linear``/``Conv1D`` weight)."""
    w = getattr(proj, "weight", None)
    if not isinstance(w, torch.Tensor):
        return None
    shape = shape_of(proj, "weight") or w.shape
    if len(shape) != 2:
        return None
    if isinstance(proj, nn.Linear):
        return 0, int(shape[0])
    if _int(getattr(proj, "nf", None)) == shape[1]:  # transformers' Conv1D: (in, out)
        return 1, int(shape[1])
    return None


def _layout_for(name: str, layout: QKLayout | None) -> tuple[bool, Mapping[str, int] | None]:
    if not layout:
        return False, None
    for key in (name, name.rsplit(".", 1)[-1]):
        if key in layout:
            return True, layout[key]
    return False, None


def _explicit(spec: Mapping[str, int], size: int) -> tuple[int, int, int]:
    heads = _int(spec.get("heads"))
    if not heads:
        raise ValueError(f"qk_layout: 'heads' must be an int >= 1, got {spec!r}")
    kv = _int(spec.get("kv_heads")) or heads
    hd = _int(spec.get("head_dim")) or (size // (heads + 2 * kv))
    if (heads + 2 * kv) * hd != size:
        raise ValueError(f"qk_layout: {spec!r} does not split {size} outputs as "
                         f"(heads + 2 * kv_heads) * head_dim")
    return heads, kv, hd


def find_qk(model: nn.Module, shape_of: ShapeOf | None = None,
            layout: QKLayout | None = None) -> list[QKSource]:
    """The q/k sources known at attach (no pending ones), in module order.

    ``shape_of(owner, name)`` gives a parameter's unsharded shape where sharding flattened
    it (FSDP1, ``Sharding.shape_of``). Parameters are referenced, not copied, and sliced at
    measurement time, so every in-place optimizer update is seen.
    """
    return find(model, shape_of or no_shape, layout, allow_pending=False).ordered()


def _looks_like_attention(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return "attention" in name or name.endswith("attn")


def find(model: nn.Module, shape_of: ShapeOf, layout: QKLayout | None,
         allow_pending: bool) -> Found:
    """Every attention module's q/k source, in module order (see the module docstring).

    Raises:
        ValueError: A ``layout`` entry does not fit its projection's shape.
    """
    found = Found()
    names = {id(m): n for n, m in model.named_modules()}
    modules = list(model.modules())
    claimed: set[int] = set()  # projections already used (a wrapper must not re-find them)
    reported: set[int] = set()  # owners with a report entry
    for index, owner in enumerate(modules):
        how, src = _one(owner, index, names, shape_of, layout, allow_pending, found, claimed)
        cls = type(owner).__name__
        if src is not None:
            found.sources.append((index, src))
            found.entries.append((cls, how, True))
        elif how:
            found.entries.append((cls, how, False))
        if how or src is not None:
            reported.add(id(owner))
    reported |= {id(p.owner) for p in found.pending}
    # attention-like modules with nothing found and no attention-like child: report them
    for owner in modules:
        if id(owner) in reported or not _looks_like_attention(owner):
            continue
        if any(id(m) in reported or (m is not owner and _looks_like_attention(m))
               for m in owner.modules()):
            continue  # a wrapper around an attention module
        found.entries.append((type(owner).__name__, "no q/k projection recognised "
                              "(attach(qk_layout=...) maps a fused one)", False))
    return found


def _one(owner: nn.Module, index: int, names: dict[int, str], shape_of: ShapeOf,
         layout: QKLayout | None, allow_pending: bool, found: Found, claimed: set[int]
         ) -> tuple[str, QKSource | None]:
    """``(how, source)`` for one module; ``("", None)``: not an attention module."""
    if isinstance(owner, nn.MultiheadAttention):
        e, hd = owner.embed_dim, owner.head_dim
        qb, kb = _part(owner, "in_proj_bias", 0, 0, e), _part(owner, "in_proj_bias", 0, e, 2 * e)
        if owner.in_proj_weight is not None:
            q = _part(owner, "in_proj_weight", 0, 0, e)
            k = _part(owner, "in_proj_weight", 0, e, 2 * e)
        else:
            q, k = _part(owner, "q_proj_weight"), _part(owner, "k_proj_weight")
        if q is None or k is None:
            return "MultiheadAttention without q/k weights", None
        return "in_proj_weight", QKSource("rows", q, k, qb, kb, hd)
    children = dict(owner.named_children())
    for child_name, proj in children.items():
        given, spec = _layout_for(names.get(id(proj), child_name), layout)
        if not given or id(proj) in claimed:
            continue
        claimed.add(id(proj))
        axis_size = _fused_axis(proj, shape_of)
        if spec is None:
            return f"'{child_name}' off (qk_layout)", None
        if axis_size is None:
            raise ValueError(f"qk_layout: {names.get(id(proj), child_name)!r} is not a "
                             f"Linear or Conv1D")
        geometry = _explicit(spec, axis_size[1])
        return _describe(child_name, axis_size[0], geometry, "qk_layout"), _fused_source(
            proj, axis_size[0], geometry)
    for child_name in FUSED:
        proj = children.get(child_name)
        if proj is None or id(proj) in claimed:
            continue
        if getattr(owner, "is_cross_attention", False):
            return f"cross-attention ('{child_name}' holds k/v only)", None
        axis_size = _fused_axis(proj, shape_of)
        if axis_size is None:
            continue
        claimed.add(id(proj))
        axis, size = axis_size
        geometry = _geometry(owner, size)
        if geometry is not None:
            return _describe(child_name, axis, geometry, ""), _fused_source(proj, axis, geometry)
        if not allow_pending:
            return (f"fused '{child_name}' ({size} outputs): heads unknown at attach and "
                    "sharded (give attach(qk_layout=...))"), None
        found.pending.append(Pending(index, owner, proj, child_name, axis, size))
        return "", None
    for q_name, k_name in SEPARATE:
        q, k = children.get(q_name), children.get(k_name)
        if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
            hd = _head_dim(owner, q.out_features) or _attr(owner, _HEAD_DIM)
            if hd and q.out_features % hd == 0 and k.out_features % hd == 0:
                claimed.update((id(q), id(k)))
                return (f"{q_name}/{k_name}, {q.out_features // hd}/{k.out_features // hd} "
                        f"heads x {hd}"), QKSource(
                    "rows", Part(q.weight, owner=q, name="weight"),
                    Part(k.weight, owner=k, name="weight"), _part(q, "bias"),
                    _part(k, "bias"), hd)
            return f"{q_name}/{k_name} without a known head size", None
    if "query_key_value" in children:
        return "'query_key_value' interleaves heads (not read)", None
    return "", None


def _describe(name: str, axis: int, geometry: tuple[int, int, int], how: str) -> str:
    heads, kv, hd = geometry
    kind = "rows" if axis == 0 else "Conv1D columns"
    heads_text = f"{heads} heads" if kv == heads else f"{heads}/{kv} heads"
    return f"fused '{name}' ({kind}, {heads_text} x {hd}{', ' + how if how else ''})"


def resolve(found: Found, pending: Pending) -> None:
    """Turn a pending projection into a source from the geometry the capture saw (or
    report why not). Appends to ``found``."""
    cls = type(pending.owner).__name__
    if pending.geometry is None:
        found.entries.append((cls, f"fused '{pending.name}': no attention call followed it "
                              "in the first sampled forward", False))
        return
    heads, kv, hd = pending.geometry
    if (heads + 2 * kv) * hd != pending.size:
        found.entries.append((cls, f"fused '{pending.name}' ({pending.size} outputs) does not "
                              f"split as the attention's {heads}/{kv} heads x {hd}", False))
        return
    found.sources.append((pending.index, _fused_source(pending.proj, pending.axis,
                                                        pending.geometry)))
    found.entries.append((cls, _describe(pending.name, pending.axis, pending.geometry,
                                         "from the first sampled forward"), True))


def report(entries: list[tuple[str, str, bool]], pending: int = 0) -> str:
    """One line: how many attention modules have q/k norms, grouped by class and how."""
    groups: dict[tuple[str, str, bool], int] = {}
    for entry in entries:
        groups[entry] = groups.get(entry, 0) + 1

    def text(has: bool) -> str:
        return "; ".join(f"{n} {cls} ({how})" for (cls, how, h), n in groups.items()
                         if h == has)

    have = sum(n for (_, _, h), n in groups.items() if h)
    total = sum(groups.values()) + pending
    line = f"q/k norms for {have} of {total} attention modules"
    if have:
        line += f": {text(True)}"
    if have < total - pending:
        line += f"; none for {text(False)}"
    if pending:
        line += f"; {pending} fused projections read from the first sampled forward"
    return line


class QKDiscovery:
    """The monitor's q/k sources, with the fused projections whose geometry the first
    sampled forward tells (see the module docstring). Logs one line at attach, and one
    more when pending projections are resolved. Training thread only.

    Args:
        capturing: Whether the monitor is measuring a forward now.
    """

    def __init__(self, model: nn.Module, shape_of: ShapeOf, layout: QKLayout | None,
                 allow_pending: bool, capturing: Callable[[], bool]) -> None:
        self.found = find(model, shape_of, layout, allow_pending)
        self.sources = self.found.ordered()
        self._capturing = capturing
        self._ran: list[Pending] = []  # pending projections run since the last attention
        self._saw_attention = False
        self._ran_this_step = False  # a pending projection ran in a measured forward
        self._waited = 0  # sampled steps that ran one and measured no attention call
        self._handles: list[Any] = [
            p.proj.register_forward_hook(lambda m, a, o, p=p: self._ran_once(p))
            for p in self.found.pending]
        if self.found.entries or self.found.pending:
            missing = any(not has for _, _, has in self.found.entries)
            log.log(logging.WARNING if missing else logging.INFO, "logitwatch: %s",
                    report(self.found.entries, len(self.found.pending)))

    @property
    def pending(self) -> bool:
        """Whether some fused projections wait for the first sampled forward."""
        return bool(self._handles)

    def _ran_once(self, pending: Pending) -> None:
        if not self._capturing() or pending.geometry is not None:
            return
        self._ran_this_step = True
        # once per projection: with no attention call to clear the list (one the capture
        # does not see), it grew by every layer on every sampled forward, for ever
        if not any(p is pending for p in self._ran):
            self._ran.append(pending)

    def on_attention(self, query: torch.Tensor, key: torch.Tensor) -> None:
        """An attention call was measured: it is fed by the projections that ran since the
        previous one."""
        self._saw_attention = True
        if self._ran and query.dim() == 4 and key.dim() == 4:
            geometry = (int(query.shape[1]), int(key.shape[1]), int(query.shape[-1]))
            for p in self._ran:
                p.geometry = geometry
        self._ran.clear()

    def step_end(self) -> bool:
        """At the end of a sampled step: once an attention call was seen, resolve the
        pending projections, remove the hooks and log what came of it. Returns whether the
        sources changed."""
        if not self._handles:
            return False
        if not self._saw_attention:
            if self._ran_this_step:
                self._waited += 1
                self._ran_this_step = False
            if self._waited < GIVE_UP_AFTER:
                return False
            return self._give_up()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        before = len(self.found.entries)
        for p in self.found.pending:
            resolve(self.found, p)
        self.found.pending.clear()
        self.sources = self.found.ordered()
        entries = self.found.entries[before:]
        log.log(logging.WARNING if any(not has for _, _, has in entries) else logging.INFO,
                "logitwatch: from the first sampled forward, %s", report(entries))
        return True

    def _give_up(self) -> bool:
        """No attention call was measured after the pending projections in
        :data:`GIVE_UP_AFTER` sampled steps: stop waiting (remove the hooks), say once for
        which projections q/k norms are not reported and why. Returns False: the sources
        are unchanged."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._ran.clear()
        entries = []
        for p in self.found.pending:
            entries.append((type(p.owner).__name__, (
                f"fused '{p.name}' ({p.size} outputs): heads unknown at attach, and no "
                f"attention call the monitor measures followed it in {GIVE_UP_AFTER} "
                "sampled steps (attention computed by hand or by a custom kernel; give "
                "attach(qk_layout=...) or record_attention)"), False))
        self.found.entries.extend(entries)
        self.found.pending.clear()
        log.warning("logitwatch: gave up reading fused projections' heads from the sampled "
                    "forwards: %s", report(entries))
        return False

    def close(self) -> None:
        """Remove the hooks (detach)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
