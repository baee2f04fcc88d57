"""The validation of the ``Page`` options the loss-jump paging policy uses (``repeats`` and
its qualifiers, the confirmation over two steps, the precursor and the adaptive-optimizer
gates): a bad option fails when the rule is built, naming the option, and a good one
survives ``to_dict``/``from_dict``. The policy itself is tested in
``test_alerts_loss_jump.py``.
"""

from __future__ import annotations

import pytest

from logitwatch.server.alerts.spec import Page, RuleError


def test_page_repeats_is_validated() -> None:
    for bad in ({"repeats": 1}, {"repeats": True}, {"repeats": 3, "repeats_within": 0}):
        with pytest.raises(RuleError, match="repeats"):
            Page(**bad)
    assert Page(repeats=3).to_dict()["repeats_within"] == 20
    assert Page.from_dict({"repeats": 2, "repeats_within": 50}).repeats == 2
    for bad in ({"repeats": 3, "repeats_built": 4, "precursor_above": 2.0, "with_rules": ("a",)},
                {"repeats": 3, "repeats_built": 1, "precursor_above": 2.0, "with_rules": ("a",)}):
        with pytest.raises(RuleError, match="repeats_built must be"):
            Page(**bad)
    with pytest.raises(RuleError, match="give repeats and precursor_above"):
        Page(repeats=3, repeats_built=2)
    assert Page.from_dict({"repeats": 3, "repeats_built": 2, "precursor_above": 2.2,
                           "with_rules": ["a"]}).repeats_built == 2
    for bad in (0, 1, 1.5, -0.5, True, "half"):
        with pytest.raises(RuleError, match="repeats_aftershock must be"):
            Page(repeats=3, repeats_aftershock=bad)
    with pytest.raises(RuleError, match="repeats_aftershock qualifies repeats"):
        Page(after=100, repeats_aftershock=0.5)
    assert Page.from_dict({"repeats": 3, "repeats_aftershock": 0.5}).repeats_aftershock == 0.5


def test_page_confirmation_is_validated() -> None:
    with pytest.raises(RuleError, match="confirm_steps"):
        Page(with_rules=("a",), confirm_steps=-1)
    with pytest.raises(RuleError, match="at_once_above"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=float("nan"))
    with pytest.raises(RuleError, match="give with_rules"):
        Page(after=10, confirm_steps=1)
    with pytest.raises(RuleError, match="precursor_above"):
        Page(with_rules=("a",), precursor_above=-1)
    with pytest.raises(RuleError, match="aftershock_above"):
        Page(with_rules=("a",), precursor_above=2.2, aftershock_above=float("inf"))
    with pytest.raises(RuleError, match="give precursor_above"):
        Page(with_rules=("a",), aftershock_above=12)
    with pytest.raises(RuleError, match="at_once_adaptive_above must be a number"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5, confirm_adaptive=True,
             at_once_adaptive_above=-1)
    with pytest.raises(RuleError, match="under confirm_adaptive: give both"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5, at_once_adaptive_above=12)
    with pytest.raises(RuleError, match="climb_above must be a number"):
        Page(with_rules=("a",), precursor_above=2.2, climb_above="2.5")
    with pytest.raises(RuleError, match="climb_above is an alternative to precursor_above"):
        Page(with_rules=("a",), climb_above=2.5)
    back = Page.from_dict(Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5,
                               precursor_above=2.2, aftershock_above=12,
                               climb_above=2.5).to_dict())
    assert (back.confirm_steps, back.at_once_above, back.precursor_above,
            back.aftershock_above, back.climb_above) == (1, 2.5, 2.2, 12, 2.5)
