"""The bench's peer detectors against the tools they stand for, where the tool is installed
here: Lightning's ``SpikeDetection`` (``peer_detectors.lightning``) on the same losses."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.scenario_tools import load


def _real_lightning(losses: list[float]) -> int | None:
    """The batch at which Lightning's SpikeDetection (defaults) raises, driven as its
    ``on_train_batch_end`` drives it on one process (no Fabric needed for the decision)."""
    from lightning_fabric.utilities.spike import SpikeDetection

    det = SpikeDetection()
    for i, v in enumerate(losses):
        loss = torch.tensor(v)
        if i >= det.warmup and det._is_spike(loss):
            return i
        det._update_stats(loss)
    return None


@pytest.mark.parametrize("seed", range(40))
def test_the_lightning_peer_stops_where_spike_detection_raises(seed: int) -> None:
    pytest.importorskip("torchmetrics")
    rng = random.Random(seed)
    level = rng.uniform(0.5, 6.0)
    losses = [level * (1 + 0.05 * rng.gauss(0, 1)) for _ in range(300)]
    for _ in range(rng.randint(0, 3)):  # spikes of 1.5-5x, a NaN now and then
        at = rng.randrange(1, 300)
        losses[at] = math.nan if rng.random() < 0.2 else losses[at] * rng.uniform(1.5, 5.0)
    peer = list(load("peer_detectors").lightning(list(enumerate(losses))))
    real = _real_lightning(losses)
    assert peer == ([] if real is None else [real]), (seed, peer, real)
