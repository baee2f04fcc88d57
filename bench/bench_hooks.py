"""Cost of the hooks on a CPU GPT-2-style model, as ratios against no hooks in the same run.

Configurations, interleaved round by round so that a busy machine hurts all alike:

* ``none``: the plain training step (AdamW, clip_grad_norm_ at 1.0);
* ``between``: ``attach()`` sampling no timed step: what every step between two samples
  costs (the history: loss, grad norm, clip flag, lr, log Z on 64 positions, hidden RMS);
* ``default``: ``attach()`` with its defaults (one step in 10, 1 % overhead budget);
* ``every``: every step sampled with the whole catalog, no budget;
* ``wandb``: ``wandb.watch(model, log="all", log_freq=1)`` in offline mode plus a
  ``wandb.log`` of the loss each step (skipped if wandb is not installed).

Each figure is the mean step time over ``--steps`` steps after ``--warmup``; the ratio is
taken per round against that round's ``none``, and the median over rounds is printed.
Also printed: peak live tensor bytes of one sampled step with and without hooks (a
``TorchDispatchMode`` counting the tensors allocated and still alive, views excluded), and the
host-device read-backs (``.item()``, ``.cpu()``, ``.tolist()``, ...) counted on a
non-sampled and on a sampled step.

    python bench/bench_hooks.py                      # 4 layers, d 256, seq 256, batch 2
    python bench/bench_hooks.py --rounds 5 --steps 20 --no-wandb
    python bench/bench_hooks.py --rounds 5 --steps 30 --threads 1 --clock thread
    python bench/bench_hooks.py --threads 1 --batch 8 --vocab 8192   # the issue's setting
    python bench/bench_hooks.py --threads 1 --parts 20   # where a sampled step's time goes
    python bench/bench_hooks.py --threads 1 --clock thread --batch 8 --vocab 8192 \
        --no-wandb --interleave 40                  # step by step, with a 95 % interval

``--parts N`` runs N plain and N every-step steps interleaved in one process (two models)
and prints, per sampled step, the thread CPU time of each part of the monitor (median):
the attention statistics, ``final.*``, the q/k norms, the frame's read-back, the rest of
the frame and of the monitor's step end, next to the medians of both steps.

``--interleave N`` replaces the rounds: every configuration's model is built and attached
once, then N cycles each run one step of every configuration, in an order shuffled cycle by
cycle (seeded), so that a slow minute of a shared machine falls on all of them alike
(a round of ``--steps`` steps per configuration does not: its ratios swing several points from
round to round on a two-core machine). The ratio printed is the total time of a
configuration's N steps over the plain steps' of the same cycles, with a 95 % moving-block
bootstrap interval (blocks of 10 cycles); a single figure that says how far it can be trusted.
N is a multiple of 10, at least 20. There ``default`` is replaced by ``1in10``: one step in
10, no budget.
The budget judges its cost against the wall time between two of its own steps, which
interleaving stretches to a whole cycle, so it would keep a narrower interval than in a real
job (at the bench's settings the budget keeps 10: ``attach()`` defaults sample one step in 10
there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from logitwatch.hooks._probes import CountSyncs, LiveBytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(args: argparse.Namespace) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(
        n_embd=args.d_model, n_layer=args.layers, n_head=args.heads, n_positions=args.seq,
        vocab_size=args.vocab, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel._from_config(config, attn_implementation=args.attn)


#: The configurations that sample at a fixed interval, without the overhead budget:
#: ``between`` samples step 0 (a warm-up step) and never again; ``1in10`` is the default
#: interval without the budget's clock (``--interleave``); ``every`` samples every step.
FIXED_INTERVAL = {"between": 10**9, "1in10": 10, "every": 1}


class Runner:
    """One configuration: a model, its optimizer and whatever is attached to it."""

    def __init__(self, name: str, args: argparse.Namespace, state: dict[str, Any]) -> None:
        self.name, self.args = name, args
        self.model = build(args)
        self.model.load_state_dict(state)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.mon: Any = None
        self.wandb_run: Any = None
        self.gen = torch.Generator().manual_seed(1)

    def start(self) -> None:
        from logitwatch.client import Client
        from logitwatch.hooks import attach

        if self.name == "default":
            self.mon = attach(self.model, self.opt, run="bench", client=Client(None, run="bench"))
        elif self.name in FIXED_INTERVAL:
            self.mon = attach(self.model, self.opt, run="bench",
                              sample_every=FIXED_INTERVAL[self.name], overhead_budget=None,
                              client=Client(None, run="bench"))
        elif self.name == "wandb":
            import wandb

            self.wandb_run = wandb.init(project="bench", mode="offline",
                                        dir=self.args.tmp, reinit="finish_previous")
            wandb.watch(self.model, log="all", log_freq=1)

    def stop(self) -> None:
        if self.mon is not None:
            self.mon.close()
            self.mon = None
        if self.wandb_run is not None:
            import wandb

            wandb.unwatch(self.model)
            self.wandb_run.finish()
            self.wandb_run = None

    def step(self) -> None:
        a = self.args
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=self.gen)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.wandb_run is not None:
            self.wandb_run.log({"loss": loss.item()})

    def timed(self, steps: int, warmup: int) -> float:
        self.start()
        try:
            for _ in range(warmup):
                self.step()
            clock = time.thread_time if self.args.clock == "thread" else time.perf_counter
            t0 = clock()
            for _ in range(steps):
                self.step()
            return (clock() - t0) / steps
        finally:
            self.stop()


def scratch_bytes() -> int:
    """Bytes of the CPU scratch buffers the statistics keep on this thread between
    sampled steps (allocated by the warm-up step, so not in the measured step's peak)."""
    from logitwatch.hooks import _logits

    ws = getattr(_logits._local, "workspace", None)
    if ws is None:
        return 0
    return sum(t.numel() * t.element_size() for t in ws._flat.values()) + sum(
        t.numel() * t.element_size() for pair in ws._masks.values() for t in pair)


def measure_memory_and_syncs(args: argparse.Namespace, state: dict[str, Any]) -> dict:
    out: dict[str, Any] = {}
    for name in ("none", "every"):
        runner = Runner(name, args, state)
        runner.start()
        runner.step()  # warm
        with LiveBytes() as meter:
            runner.step()
        out[f"peak_{name}"] = meter.peak
        out[f"scratch_{name}"] = scratch_bytes()
        runner.stop()
    for name in ("none", "default"):
        runner = Runner(name, args, state)
        runner.start()
        counts = []
        for _ in range(3):  # with hooks: step 0 sampled, steps 1 and 2 not
            with CountSyncs() as counter:
                runner.step()
            counts.append(len(counter.calls))
        runner.stop()
        out[f"syncs_{name}"] = counts
    return out


def measure_parts(args: argparse.Namespace, state: dict[str, Any], steps: int) -> None:
    """Thread CPU time of the monitor's parts in sampled steps, beside plain steps (the
    functions wrapped in this process only; medians over ``steps`` of each)."""
    from logitwatch.hooks import _capture, _frames, _monitor

    acc: dict[str, float] = {}
    clock = time.thread_time
    wrapped = [(_capture, "attention_head_stats", "attention statistics"),
               (_capture, "final_stats", "final.*"),
               (_frames, "qk_norms", "q/k norms"),
               (_frames, "collect", "read-back (collect)"),
               (_monitor.Monitor, "_emit", "frame"),
               (_monitor.Monitor, "_end_step", "step end"),
               (_monitor.Monitor, "_record", "attention capture")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]

    def wrap(fn: Any, label: str) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                acc[label] = acc.get(label, 0.0) + clock() - t0
        return timed

    for owner, name, label in wrapped:
        setattr(owner, name, wrap(getattr(owner, name), label))
    try:
        plain, hooked = Runner("none", args, state), Runner("every", args, state)
        hooked.start()
        for _ in range(args.warmup):
            plain.step()
            hooked.step()
        t_plain: list[float] = []
        t_hooked: list[float] = []
        parts: dict[str, list[float]] = {}
        for i in range(steps):
            for runner in (plain, hooked) if i % 2 == 0 else (hooked, plain):
                acc.clear()
                t0 = clock()
                runner.step()
                dt = clock() - t0
                if runner is plain:
                    t_plain.append(dt)
                else:
                    t_hooked.append(dt)
                    for label, value in acc.items():
                        parts.setdefault(label, []).append(value)
        hooked.stop()
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    med = statistics.median
    plain_ms, hooked_ms = 1e3 * med(t_plain), 1e3 * med(t_hooked)
    print(f"\nparts of a sampled step (thread CPU, median of {steps}): plain step "
          f"{plain_ms:.1f} ms, every-step sampled {hooked_ms:.1f} ms (+{hooked_ms - plain_ms:.1f}"
          f" ms, ratio {hooked_ms / plain_ms:.3f})")
    get = {label: 1e3 * med(values) for label, values in parts.items()}
    rows = [("attention statistics", get.get("attention statistics", 0.0)),
            ("  capture around them", get.get("attention capture", 0.0)
             - get.get("attention statistics", 0.0)),
            ("final.*", get.get("final.*", 0.0)),
            ("q/k norms", get.get("q/k norms", 0.0)),
            ("read-back (collect)", get.get("read-back (collect)", 0.0)),
            ("rest of the frame", get.get("frame", 0.0) - get.get("q/k norms", 0.0)
             - get.get("read-back (collect)", 0.0)),
            ("rest of the step end", get.get("step end", 0.0) - get.get("frame", 0.0))]
    rows.append(("elsewhere (difference)", hooked_ms - plain_ms - sum(ms for _, ms in rows)))
    for label, ms in rows:
        print(f"  {label:24s} {ms:7.2f} ms")


def bootstrap_ratio(num: list[float], den: list[float], block: int = 10, draws: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` and its 95 % percentile interval from a moving-block bootstrap
    over the paired entries (cycles): runs of ``block`` consecutive cycles drawn with
    replacement, so that a sampled step in ten and a slow minute of the machine stay inside
    the blocks that are resampled."""
    import random

    rng = random.Random(seed)
    n = len(num)
    block = max(1, min(block, n))
    starts = n - block + 1
    ratio = sum(num) / sum(den)
    stats = []
    for _ in range(draws):
        idx: list[int] = []
        while len(idx) < n:
            b = rng.randrange(starts)
            idx.extend(range(b, b + block))
        idx = idx[:n]
        stats.append(sum(num[i] for i in idx) / sum(den[i] for i in idx))
    stats.sort()
    return ratio, stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]


def measure_interleaved(args: argparse.Namespace, state: dict[str, Any],
                        configs: list[str], cycles: int) -> dict[str, tuple[float, float, float]]:
    """Step-by-step interleaving of every configuration (see the module docstring)."""
    import random
    from contextlib import ExitStack

    runners = [Runner(name, args, state) for name in configs]
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in configs}
    order = random.Random(1)
    with ExitStack() as stack:
        for runner in runners:
            runner.start()
            stack.callback(runner.stop)
        for _ in range(args.warmup):
            for runner in runners:
                runner.step()
        for c in range(cycles):
            # a fresh order each cycle: no configuration always follows the same one
            for runner in order.sample(runners, len(runners)):
                t0 = clock()
                runner.step()
                times[runner.name].append(clock() - t0)
            if (c + 1) % 10 == 0 or c + 1 == cycles:
                line = ", ".join(f"{n} {1e3 * statistics.fmean(times[n]):.1f} ms"
                                 for n in configs)
                print(f"cycle {c + 1}/{cycles}: mean so far {line}", flush=True)
    return {name: bootstrap_ratio(times[name], times["none"]) for name in configs[1:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--steps", type=int, default=20, help="timed steps per config and round "
                   "(a multiple of 10 puts the same number of sampled steps in each)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--no-wandb", action="store_true")
    p.add_argument("--clock", default="wall", choices=["wall", "thread"],
                   help="wall: perf_counter; thread: CPU time of the training thread, "
                   "steadier on a shared machine (with --threads 1) but blind to work in "
                   "other threads or processes (wandb's)")
    p.add_argument("--interleave", type=int, default=0, metavar="N",
                   help="instead of rounds: N cycles of one step of every configuration, "
                   "ratios with a 95%% block-bootstrap interval (see above); a multiple of 10, at "
                   "least 20")
    p.add_argument("--parts", type=int, default=0, metavar="N",
                   help="only the breakdown of a sampled step's monitor time: N plain and N "
                   "every-step steps interleaved in one process (see above)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = ["none", "between", "default", "every"]
    if not args.no_wandb:
        try:
            import wandb  # noqa: F401

            os.environ.setdefault("WANDB_SILENT", "true")
            configs.append("wandb")
        except Exception as exc:  # noqa: BLE001
            print(f"wandb not available ({exc}); skipping it", file=sys.stderr)
    args.tmp = tempfile.mkdtemp(prefix="bench-hooks-")
    state = build(args).state_dict()
    print(f"model: GPT-2 style, {args.layers} layers, d_model {args.d_model}, "
          f"{args.heads} heads, seq {args.seq}, vocab {args.vocab}, batch {args.batch}, "
          f"attn {args.attn}, torch threads {torch.get_num_threads()}, clock {args.clock}",
          flush=True)
    if args.parts:
        measure_parts(args, state, args.parts)
        return 0
    Runner("none", args, state).timed(2, 1)  # one-time costs (lazy imports, allocator)
    if args.interleave:
        if args.interleave < 20 or args.interleave % 10:
            p.error("--interleave takes a multiple of 10 cycles (the same number of sampled "
                    "steps of a monitor sampling one step in 10 in any window), at least 20 "
                    f"(with one block of 10 the interval says nothing), got {args.interleave}")
        configs[configs.index("default")] = "1in10"
        ratios = measure_interleaved(args, state, configs, args.interleave)
        print(f"\nstep-time ratio vs no hooks ({args.interleave} interleaved cycles; total "
              "time over the plain steps' of the same cycles, 95% block-bootstrap interval):")
        for name, (r, lo, hi) in ratios.items():
            print(f"  {name:8s} {r:.3f}  ({lo:.3f}-{hi:.3f})")
        return 0
    times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        for name in order:
            runner = Runner(name, args, state)
            times[name].append(runner.timed(args.steps, args.warmup))
        line = ", ".join(f"{c} {1e3 * times[c][-1]:.1f} ms" for c in configs)
        print(f"round {r + 1}/{args.rounds}: {line}", flush=True)
    print("\nstep-time ratio vs no hooks (median over rounds of per-round ratios):")
    for name in configs[1:]:
        ratios = [t / b for t, b in zip(times[name], times["none"], strict=True)]
        print(f"  {name:8s} {statistics.median(ratios):.3f}  "
              f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
    mem = measure_memory_and_syncs(args, state)
    print(f"\npeak live tensor bytes, one step: no hooks {mem['peak_none'] / 2**20:.1f} MiB, "
          f"sampled with the whole catalog {mem['peak_every'] / 2**20:.1f} MiB "
          f"(ratio {mem['peak_every'] / mem['peak_none']:.3f}); kept between sampled steps: "
          f"{mem['scratch_every'] / 2**20:.1f} MiB of scratch buffers")
    none, hooked = mem["syncs_none"], mem["syncs_default"]
    print("host read-backs (.item/.cpu/.tolist/...) per step, steps 0-2: no hooks "
          f"{none} (the job's own: AdamW step counters); attach() defaults {hooked}; "
          f"added by the monitor: sampled step 0: {hooked[0] - none[0]}, non-sampled steps "
          f"1-2: {hooked[1] - none[1]}, {hooked[2] - none[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
