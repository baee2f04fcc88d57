"""What a replay cannot rebuild: the part of a (run, rank)'s rule memory that holds its
whole run, kept in the ``rule_memory`` table.

After a restart or an eviction the engine rebuilds a (run, rank) by replaying its newest
stored frames (:meth:`~.state.RankState._stored_frames`); what those frames cannot give back
(:data:`LONG_EXTRA` of each run-level rule, the best loss of each loss-rise tracker) is
written with each batch that changed it (:meth:`RuleMemoryMixin._save_long_state`) and put
back after the replay (:meth:`RuleMemoryMixin._load_long_state`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from logitwatch.server.alerts.loss_levels import _loss_key, _LossRise
from logitwatch.server.alerts.rules import Memory, RuleSpec
from logitwatch.server.db.models import RuleMemory

if TYPE_CHECKING:
    from logitwatch.server.alerts.state import Key

__all__ = ["LONG_EXTRA", "RuleMemoryMixin"]

#: What a scalar rule's memory holds of the whole run, which no replay of its newest
#: frames rebuilds: ``level_rise``'s lowest settled levels, ``above_peak``'s settled peak.
#: Written to ``rule_memory`` with each batch that changed it, restored after the replay.
LONG_EXTRA = ("low", "also_low", "high", "high_step", "settled", "settled_step")


def _fingerprint(rule: RuleSpec) -> str:
    """What a rule's whole-run memory depends on (its kind, series and parameters): a
    ``rule_memory`` entry written under another rule of the same name is not read back."""
    text = json.dumps([rule.kind, rule.metric, rule.over, rule.params], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RuleMemoryMixin:
    """Writes and reads back the whole-run part of the rule memory of a
    :class:`~.state.RankState` (see the module's docstring)."""

    _rules: list[RuleSpec]
    _mem: dict[Key, Memory]
    _loss: dict[tuple[int, int, int, int], _LossRise]
    _loaded: set[tuple[int, int]]
    _saved: dict[tuple[int, int], str]

    def _long_state(self, run_id: int, rank: int) -> dict[str, dict[str, object]]:
        """What (run, rank)'s memory holds of its whole run (:data:`LONG_EXTRA` of each
        run-level rule, with the rule's fingerprint; the best loss of each loss-rise
        tracker)."""
        mem: dict[str, object] = {}
        loss: dict[str, object] = {}
        for r in self._rules:
            m = self._mem.get((r.name, run_id, rank, None, None))
            if m is not None:
                kept = {k: m.extra[k] for k in LONG_EXTRA if k in m.extra}
                if kept:
                    mem[r.name] = {**kept, "rule": _fingerprint(r)}
            if r.downgrade is not None:
                key = _loss_key(run_id, rank, r.downgrade)
                t = self._loss.get(key)
                if t is not None:
                    loss[f"{key[2]}:{key[3]}"] = {"first": t.first, "best": t.best,
                                                  "best_level": t.best_level}
        return {"mem": mem, "loss": loss}

    def _save_long_state(self, session: Session, keys: Iterable[tuple[int, int]]) -> None:
        """Write the :meth:`_long_state` of ``keys`` that changed since last written, in the
        caller's (ingest) transaction."""
        rows = []
        for run_id, rank in keys:
            if (run_id, rank) not in self._loaded:
                continue
            text = json.dumps(self._long_state(run_id, rank), sort_keys=True)
            if self._saved.get((run_id, rank)) != text:
                self._saved[(run_id, rank)] = text
                rows.append({"run_id": run_id, "rank": rank, "data": text})
        if not rows:
            return
        dialect = session.get_bind().dialect.name
        insert = pg_insert if dialect == "postgresql" else sqlite_insert
        stmt = insert(RuleMemory)
        session.execute(stmt.on_conflict_do_update(
            index_elements=["run_id", "rank"], set_={"data": stmt.excluded.data}), rows)

    def _load_long_state(self, session: Session, run_id: int, rank: int) -> None:
        """After a replay: put back what (run, rank)'s memory held of its whole run, as last
        written (none written: what the replay gave stays)."""
        text = session.scalar(select(RuleMemory.data).where(RuleMemory.run_id == run_id,
                                                            RuleMemory.rank == rank))
        if text is None:
            return
        try:
            saved = json.loads(text)
            mem, loss = saved["mem"], saved["loss"]
        except (ValueError, KeyError, TypeError):
            return
        for r in self._rules:
            m = self._mem.get((r.name, run_id, rank, None, None))
            if m is not None:
                kept = mem.get(r.name) or {}
                if kept.get("rule") != _fingerprint(r):
                    continue  # written for another rule of that name (the rules changed)
                for k in LONG_EXTRA:
                    if k in kept:
                        m.extra[k] = kept[k]
                    else:
                        m.extra.pop(k, None)
            if r.downgrade is not None:
                key = _loss_key(run_id, rank, r.downgrade)
                t, was = self._loss.get(key), loss.get(f"{key[2]}:{key[3]}")
                if t is not None and isinstance(was, dict):
                    t.first, t.best, t.best_level = (was.get("first"), float(was["best"]),
                                                     float(was["best_level"]))
        self._saved[(run_id, rank)] = json.dumps(self._long_state(run_id, rank),
                                                 sort_keys=True)
