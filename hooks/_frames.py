"""The monitor's frames: the sampled step's one frame, the closing frame at ``close()``,
the history of the steps between frames, and, under sharding, the end-of-step exchange
(see :class:`~logitwatch.hooks._monitor.Monitor` and ``docs/HOOKS.md``)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ._buffer import collect
from ._cost import thread_clock
from ._history import LR, HistoryBlock
from ._qk import qk_items, qk_norms
from ._shard import GRAD_MISSING, GRAD_SQ, QK_MISSING

__all__ = ["FramesMixin"]

#: Scalars that carry the exchange's "ranks missing" counts through the step's one
#: transfer; removed from the frame.
_GRAD_MISSING, _QK_MISSING = "_lw.grad_missing", "_lw.qk_missing"


def _takes_history(send: Any) -> bool:
    """Whether a client's ``send`` accepts ``history=`` (a stand-in written before it
    existed may not)."""
    import inspect

    try:
        params = inspect.signature(send).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "history" or p.kind is inspect.Parameter.VAR_KEYWORD
               for p in params)


def _split_last(hist: dict[str, Any], last: int) -> tuple[dict[str, float],
                                                         dict[str, Any] | None]:
    """A history (:meth:`HistoryBlock.values`) split for a frame at step ``last``: that
    step's values as the frame's scalars (when it is the history's last step), and the
    steps before it as the frame's history (None when there are none)."""
    steps, series = hist["steps"], hist["scalars"]
    upto, scalars = len(steps), {}
    if steps and steps[-1] == last:
        upto -= 1
        scalars = {n: v[-1] for n, v in series.items() if v[-1] is not None}
    rest = ({"steps": steps[:upto], "scalars": {n: v[:upto] for n, v in series.items()}}
            if upto else None)
    return scalars, rest


class FramesMixin:
    """Frame building for :class:`~logitwatch.hooks._monitor.Monitor` (its state lives
    there)."""

    def _flush_history(self) -> None:
        """At close, when the last step ended unsampled: one closing frame at that step
        (``hooks.closing`` = 1) with what can still be measured after it ran: its history
        scalars (loss, grad norm, clip flag, lr, log Z, hidden RMS), the q/k norms of the
        weights as the last update left them (what a sample of that step reads; not under
        sharding, which would need a collective), and the steps before it since the last
        frame as its history. Attention and the other ``final.*`` need the step's forward:
        a step that already ran cannot be sampled. One read-back, at close, not in a
        training step."""
        last = self._step - 1
        if "step" in self.disabled or last < 0 or self._last_sampled == last:
            return
        if self._ranks is not None and not self._ranks.sends:
            return  # reduce-before-send: the group's leader sends
        try:
            self._send_flush(self._hflush.ready(wait=True))  # at close: a wait is allowed
            block = None if "history" in self.disabled else self._history.take()
            if block is None and self._hflush.sent_to == last:
                return  # a flush sent the last step already
            heads: dict[str, list[torch.Tensor]] = {}
            if self._shard is None and self._qk and "qk" not in self.disabled:
                try:
                    heads = qk_norms(self._qk)
                except Exception:
                    self._fail("qk")
            tensors = block.tensors if block is not None else []
            _, out_heads, _, _, flat = collect({}, heads, extra=tensors)
            scalars, rest = (_split_last(block.values(flat), last) if block is not None
                             else ({}, None))
            scalars["hooks.closing"] = 1.0
            scalars["hooks.sample_every"] = float(self._effective_every)
            self._send(last, scalars, out_heads, rest)
        except Exception:
            self._fail("history")

    def _end_history(self, step: int) -> None:
        """Close the step in the history: a non-sampled step keeps its lr (a host float)
        and what it recorded; a sampled one's frame has it all."""
        try:
            if not self._keeps_history():
                self._history.discard_step()
                return
            lr = self._lr()  # a CPU tensor comes as a float: it must not place the buffer
            if lr is not None and self._lr_logged != step:  # (a logged lr= is the job's)
                self._history.put(LR, lr)
            self._history.end_step(step)
        except Exception:
            self._fail("history")

    def _flush_between(self, *, now: bool = False) -> None:
        """After an unsampled step: send a started flush once its values are ready, and
        start the next when ``every`` steps are kept (:mod:`~logitwatch.hooks._history_flush`).
        Never a sync: a flush whose copy is still in flight waits for a later step.

        ``now``: a watch flagged the step that just ended (a loss or gradient spike,
        sampled next or not past the spike watch's burst; an LR jump), so the steps kept so
        far go at once, where they are host memory (a CPU job): a page the collector judges
        on that step reaches it with the step, not with a later frame. An accelerator's
        copy would be ready no sooner than the next step, whose frame (sampled, or the next
        flush) carries them anyway."""
        flush = self._hflush
        if (not flush.enabled or "history" in self.disabled or "step" in self.disabled
                or (self._ranks is not None and not self._ranks.sends)):
            return
        try:
            self._send_flush(flush.ready())
            device = self._history.device
            if now and device is not None and device.type != "cpu":
                return
            if flush.busy or self._history.kept < (1 if now else flush.every):
                return
            if device is not None and device.type not in ("cpu", "cuda"):
                flush.enabled = False  # no event to poll: the history goes with the frames
                return
            if device is not None and device.type == "cuda" and not flush.prepare(
                    self._history.capacity):
                self._warn_once("history-flush", "no pinned memory for the history's "
                                "flushes; the steps between samples go with the next frame")
                return
            block = self._history.take()
            if block is not None:
                flush.start(block, self._history.read_host(block))
                self._send_flush(flush.ready())
        except Exception:
            flush.enabled = False
            self._warn_once("history-flush", "sending the history between samples failed; "
                            "the steps between samples go with the next frame")

    def _send_flush(self, got: tuple[HistoryBlock, list[float]] | None) -> None:
        """Send a flushed history: a scalars-only frame at its last step
        (``hooks.history_flush`` = 1), the steps before it as its history."""
        if got is None:
            return
        block, flat = got
        hist = block.values(flat)
        if not hist["steps"]:
            return
        last = hist["steps"][-1]
        scalars, rest = _split_last(hist, last)
        scalars["hooks.history_flush"] = 1.0
        scalars["hooks.sample_every"] = float(self._effective_every)
        if block.dropped:
            scalars["hooks.history_dropped"] = float(block.dropped)
        self._hflush.sent_to = last
        self._send(last, scalars, {}, rest)

    def _send(self, step: int, scalars: dict[str, float], heads: dict[str, Any],
              history: dict[str, Any] | None) -> None:
        """Hand one frame to the client, with ``history`` where it holds a series and the
        client takes it."""
        if history is not None and history["scalars"] and self._send_takes_history():
            self.client.send(step, scalars, heads, time=time.time(), history=history)
        else:
            self.client.send(step, scalars, heads, time=time.time())

    def _take_history(self) -> HistoryBlock | None:
        """The steps since the previous frame, for this frame (their rows are read back
        with it)."""
        if "history" in self.disabled:
            return None
        try:
            block = self._history.take()
            if self._history.skipped:
                self._warn_once("history-device", "values on another device than the "
                                "first one are left out of the history")
            return block
        except Exception:
            self._fail("history")
            return None

    def _send_takes_history(self) -> bool:
        send = self.client.send
        key = getattr(send, "__func__", send)
        if key is not self._send_key:
            self._send_key, self._send_history = key, _takes_history(send)
            if not self._send_history:
                self._warn_once("history-send", "the client's send() takes no history=; "
                                "the steps between frames are not sent")
        return self._send_history

    # -- sharding: the exchange ----------------------------------------------------------

    def _plan_exchange(self, shard: Any) -> None:
        """Lay the exchange vector out (sizes fixed here, never by anything failing at
        step time) and check with the other ranks that every rank has the same layout."""
        try:
            shard.plan(qk_items(self._qk) if self._qk else [])
        except Exception:
            shard.plan([])
            self._fail("qk")
        try:
            if not shard.agree_layout():
                self._warn_once("layout", "the ranks found different q/k layouts; q/k norms "
                                "are not measured on any rank")
            self._vec = shard.new_vector()
        except Exception:
            self._warn_once("layout", "the exchange could not be set up")

    def _exchange(self) -> torch.Tensor | None:
        """The end of a sampled step under sharding, on every rank: this rank's local
        sums (or "missing" marks where a part is off or fails) go into the vector, and the
        one ``all_reduce(SUM)`` is always entered. Never raises."""
        shard, vec = self._shard, self._vec
        if shard is None or vec is None:
            return None
        t0 = thread_clock()
        try:
            vec.zero_()
        except Exception:
            self._warn_once("vector", "the exchange vector could not be cleared")
        try:
            local = self._grad_local
            shard.put_grad(vec, None if local is None else local[0])
        except Exception:
            self._fail("grad")
            with contextlib.suppress(Exception):
                shard.put_grad(vec, None)
        if shard.has_qk:
            try:
                if "qk" in self.disabled:
                    shard.mark_qk_missing(vec)
                else:
                    shard.put_qk(vec)
            except Exception:
                self._fail("qk")
                with contextlib.suppress(Exception):
                    shard.mark_qk_missing(vec)
        try:
            shard.reduce(vec)
        except Exception:
            self._warn_once("exchange", "the end-of-step all_reduce failed")
            return None
        finally:
            self._cost.add_host(thread_clock() - t0)
        return vec

    def _emit(self, step: int, vec: torch.Tensor | None = None) -> None:
        t0 = thread_clock()
        lr = self._lr()
        first = self._frames == 0
        sharded = self._shard is not None
        if sharded and vec is not None and not self._clip_seen and self._grad_local is not None:
            try:
                other = self._grad_local[1].to(vec.device)
                self._buffer.grad_norm = (vec[GRAD_SQ] + other).sqrt()
            except Exception:
                self._fail("grad")
        scalars = self._buffer.scalars(lr=lr, default_max_norm=self._max_grad_norm,
                                       ln_vocab=self._ln_vocab if first else None)
        if self._optim_adaptive is not None:  # a host float: no transfer
            scalars.setdefault("optim.adaptive", self._optim_adaptive)
        if sharded and vec is not None:  # read back with the rest, then removed
            scalars[_GRAD_MISSING] = vec[GRAD_MISSING]
            scalars[_QK_MISSING] = vec[QK_MISSING]
        clip_from_device = self._clip_hits is not None and self._clip_steps > 0
        if clip_from_device:
            scalars["grad.clip_rate"] = self._clip_hits.float() / self._clip_steps
        self._clip_hits, self._clip_steps = None, 0
        heads = self._buffer.heads()
        if self._shard is not None:
            if vec is not None and self._shard.has_qk:
                try:
                    heads.update(qk_norms(self._qk, self._shard.qk_sums(vec)))
                except Exception:
                    self._fail("qk")
        elif self._qk and "qk" not in self.disabled:
            try:
                heads.update(qk_norms(self._qk))
            except Exception:
                self._fail("qk")
        reduced, self._reduced = self._reduced, None
        if reduced is not None and self._ranks is not None and not self._ranks.detail:
            reduced.apply(scalars, heads)  # the group's values (``_reduce``)
        block = self._take_history()
        if self._ranks is not None and not self._ranks.sends and not self.fuses:
            # reduce-before-send: the group's leader sends, and no fuse reads this frame;
            # nothing of it is read back (a host read of every matrix, to be thrown away)
            self._cost.add_host(thread_clock() - t0)
            self._frames += 1
            return
        if self.fuses:
            self.fuses.before_frame(scalars, heads)
        host_ms = 1e3 * (self._cost.host_seconds + thread_clock() - t0)
        out_scalars, out_heads, syncs, nbytes, rows = collect(
            scalars, heads, extra=block.tensors if block is not None else None)
        history = None
        if block is not None:
            try:
                history = block.values(rows)
                if block.dropped:
                    out_scalars["hooks.history_dropped"] = float(block.dropped)
            except Exception:
                self._fail("history")
        if sharded:
            self._drop_missing(out_scalars, out_heads, vec)
        if "grad.clipped" in out_scalars and not clip_from_device:
            self._clipped_window.append(out_scalars["grad.clipped"])
            out_scalars["grad.clip_rate"] = sum(self._clipped_window) / len(
                self._clipped_window)
        out_scalars["hooks.host_ms"] = host_ms
        self._cost.add_host(thread_clock() - t0)
        if self._shard is not None and self._shard.device.type != "cpu":
            syncs += 1  # reading the ranks' agreed interval at the end of this step
        if self._ranks is not None:
            syncs += self._ranks.syncs
        out_scalars["hooks.syncs"] = float(syncs)
        out_scalars["hooks.bytes"] = float(nbytes)
        out_scalars["hooks.sample_every"] = float(self._effective_every)
        if self._cost.last_extra is not None:
            out_scalars["hooks.cost_ms"] = 1e3 * self._cost.last_extra
        overhead = self._cost.overhead(self._effective_every)
        if overhead is not None:
            out_scalars["hooks.overhead"] = overhead
        if self.fuses:
            self.fuses.after_frame(step, out_scalars, out_heads)
        self._frames += 1
        if self._ranks is not None and not self._ranks.sends:
            return  # reduce-before-send: the group's leader sends
        try:  # a flush still in flight goes first: its steps come before this frame's
            self._send_flush(self._hflush.ready(wait=True))  # the read-back above synced
            if self._hflush.wants_prepare:
                self._hflush.prepare(self._history.capacity)
        except Exception:
            self._fail("history")
        self._send(step, out_scalars, out_heads, history)

    def _drop_missing(self, scalars: dict[str, float], heads: dict[str, Any],
                      vec: torch.Tensor | None) -> None:
        """Remove what some rank could not contribute to the exchange (a sum over the
        ranks that did would be wrong); the job's own clip norm stays (already global)."""
        grad_missing = scalars.pop(_GRAD_MISSING, 1.0)
        qk_missing = scalars.pop(_QK_MISSING, 1.0)
        if not (grad_missing == 0 or self._clip_seen):  # NaN counts as missing
            for name in ("grad.norm", "grad.clipped"):
                scalars.pop(name, None)
            if vec is not None and "grad" not in self.disabled:
                self._warn_once("grad-missing", "grad.norm is left out of this rank's frames "
                                "while another rank cannot compute its gradient part "
                                "(see that rank's log)")
        if not qk_missing == 0:
            for name in [n for n in heads if n.startswith("qk.")]:
                del heads[name]
            if vec is not None and "qk" not in self.disabled and self._shard is not None \
                    and self._shard.has_qk:
                self._warn_once("qk-missing", "q/k norms are left out of this rank's frames "
                                "while another rank cannot compute its part (see that "
                                "rank's log)")

