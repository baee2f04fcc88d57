"""``logitwatch replay`` says when a file's frames leave steps out that no ``history``
carried: the rules judged those steps' loss, gradient norm, clip flag and LR only at the
frames' own steps (docs/ALERTS.md, *Steps, not samples*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from logitwatch.cli import main as cli
from logitwatch.server.alerts.replay import replay


def sampled(every: int, n: int, *, history: bool, run: str = "r") -> list[dict[str, Any]]:
    """``n`` frames of one run, one step in ``every``; with ``history``, each carries the
    loss of the steps since the frame before it."""
    out = []
    for i in range(n):
        step = every * i
        f: dict[str, Any] = {"run": run, "seq": i, "step": step, "time": 1000.0 + i,
                             "scalars": {"loss": 3.0}}
        if history and i:
            steps = list(range(step - every + 1, step))
            f["history"] = {"steps": steps, "scalars": {"loss": [3.0] * len(steps)}}
        out.append(f)
    return out


def test_frames_without_history_count_the_steps_they_left_out() -> None:
    assert replay(sampled(10, 28, history=False)).unsent_steps == 27 * 9
    assert replay(sampled(10, 28, history=True)).unsent_steps == 0
    assert replay(sampled(1, 28, history=False)).unsent_steps == 0  # every step sent


def test_a_partial_history_counts_what_it_did_not_carry() -> None:
    frames = sampled(10, 3, history=True)
    frames[2]["history"] = {"steps": [15, 16, 17, 18, 19], "scalars": {"loss": [3.0] * 5}}
    # the first gap (1-9) was carried, of the second (11-19) only 15-19
    assert replay(frames).unsent_steps == 4


def test_a_late_or_resumed_frame_counts_nothing() -> None:
    frames = sampled(10, 4, history=True)  # steps 0, 10, 20, 30
    late = {"run": "r", "seq": 4, "step": 15, "time": 1004.0, "scalars": {"loss": 3.0}}
    nxt = {"run": "r", "seq": 5, "step": 40, "time": 1005.0, "scalars": {"loss": 3.0},
           "history": {"steps": list(range(31, 40)), "scalars": {"loss": [3.0] * 9}}}
    assert replay([*frames, late, nxt]).unsent_steps == 0


def test_ranks_and_runs_are_counted_apart() -> None:
    a = sampled(5, 4, history=False, run="a")  # 3 gaps of 4
    b = [{**f, "rank": 1} for f in sampled(5, 4, history=True, run="a")]
    assert replay([*a, *b]).unsent_steps == 12


def test_the_cli_says_so(tmp_path: Path) -> None:
    for frames, said in ((sampled(10, 28, history=False), True),
                         (sampled(10, 28, history=True), False)):
        data = tmp_path / "run.jsonl"
        data.write_text("\n".join(json.dumps(f) for f in frames) + "\n")
        r = CliRunner().invoke(cli, ["replay", str(data)])
        assert r.exit_code == 0, r.output + r.stderr
        assert ("note: 243 steps between the frames came with no `history`" in r.stderr) is said
        assert ("no `history`" in r.stderr) is said, r.stderr
