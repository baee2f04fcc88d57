"""Which rules are in force, and the engine's background work in the collector.

Rules come from three layers, each overriding the previous by rule name: the defaults
(:data:`~.defaults.DEFAULT_RULES`, adjusted by the ``alert_*`` settings), a YAML file named
by ``$LOGITWATCH_ALERT_RULES``, and rules set through the API (table ``alert_rules``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.alerts.defaults import (
    DEFAULT_RULES,
    RULES_ENV,
    load_rules_file,
    merge_rules,
)
from logitwatch.server.alerts.rules import RuleError, RuleSpec
from logitwatch.server.db.models import AlertRule, Run

__all__ = ["api_rules", "configured_rules", "rules_file", "start_background", "STALE_CHECK_S"]

log = logging.getLogger("logitwatch.alerts")

STALE_CHECK_S = 30.0


def rules_file(path: str | None = None) -> str | None:
    """The YAML rules file in force: ``path`` when given, else ``$LOGITWATCH_ALERT_RULES``
    (None: no file)."""
    return path if path else os.environ.get(RULES_ENV) or None


def configured_rules(settings: Any, path: str | None = None) -> list[RuleSpec]:
    """Defaults with the settings' ``alert_*`` applied, then the YAML file's rules (``path``,
    else ``$LOGITWATCH_ALERT_RULES``): the rules ``logitwatch serve`` and ``logitwatch
    replay`` start from (the collector then merges the rules stored through the API)."""
    rules: list[RuleSpec] = []
    for r in DEFAULT_RULES:
        if r.name == "attn_logit_rising":
            params = dict(r.params, factor=settings.alert_logit_factor,
                          floor=settings.alert_logit_floor)
            if "alert_logit_threshold" in settings.model_fields_set:
                params["ceiling"] = settings.alert_logit_threshold
            r = dataclasses.replace(r, params=params, for_samples=settings.alert_for_samples)
        rules.append(r)
    path = rules_file(path)
    if path:
        rules = merge_rules(rules, load_rules_file(path))
    return rules


def api_rules(session: Session) -> list[RuleSpec]:
    """Rules set through the API, oldest first. A stored rule this version refuses (one
    stored before its params were checked) is left out with an error in the log, so the
    collector still starts and the other rules still apply."""
    out = []
    for row in session.scalars(select(AlertRule).order_by(AlertRule.id)).all():
        try:
            out.append(RuleSpec.from_dict(row.spec))
        except (RuleError, TypeError) as e:
            log.error("stored alert rule %r is not used: %s; replace it (PUT "
                      "/api/v1/alerts/rules/%s) or delete it", row.name, e, row.name)
    return out


def start_background(app: Any) -> Callable[[], None]:
    """Load the API rules into the engine and start the no-data checker thread; returns
    a function that stops it."""
    from logitwatch.server.db.session import session_scope
    from logitwatch.server.store.alerts import alert_out

    state = app.state
    with session_scope(state.sessions) as s:
        extra = api_rules(s)
    if extra:
        state.alert_engine.set_rules(merge_rules(state.alert_engine.rules, extra))
    state.base_rules = configured_rules(state.settings)
    stop = threading.Event()
    started = time.time()  # silence is judged only over time this collector listened

    def loop() -> None:
        while not stop.wait(STALE_CHECK_S):
            try:
                with session_scope(state.sessions) as s:
                    fired = state.alert_engine.check_stale(s, time.time(),
                                                           listening_since=started)
                    outs = [alert_out(a, run) for a in fired
                            if (run := s.get(Run, a.run_id)) is not None]
                if state.notifier is not None:
                    for a in outs:
                        state.notifier.notify(a)
            except Exception:  # never let the checker die
                log.exception("no-data check failed")

    t = threading.Thread(target=loop, name="logitwatch-alerts-stale", daemon=True)
    t.start()

    def close() -> None:
        stop.set()
        t.join(5)

    return close
