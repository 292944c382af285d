"""torch half of ``python -m graphjit bench train``: the models and the timed training step.

* :func:`build_model`: the ``mlp`` and ``block`` models the benchmark (and ``tests/test_gpu_training.py``)
  trains, on torch's default device and dtype;
* :class:`TrainBench`: builds a model (eager, or wrapped by ``graphjit.graphed_layer``), its data and SGD step,
  runs the eager-vs-graphed correctness check and times one variant.

The options, the loop over models and variants, the summary, JSON, table and plot are framework-neutral and
live in :mod:`graphjit.bench.train`.  torch is imported by :class:`TrainBench` when it is created (and passed
to :func:`build_model`), not with this module.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

from .. import common


# -- models ---------------------------------------------------------------------------------------
def build_model(torch: Any, kind: str, layers: int, hidden: int, seq: int) -> Any:
    """``kind`` ``"mlp"``: ``layers`` x [Linear(H, 4H), GELU, Linear(4H, H)]; otherwise ``layers`` pre-LayerNorm
    transformer blocks (4 heads, causal over at most ``seq`` tokens), an ``nn.Sequential`` either way.
    Raises ValueError for a block whose ``hidden`` is not a multiple of 4."""
    nn: Any = torch.nn  # declared Any, so that mypy accepts nn.Module as Block's base
    if kind == "mlp":
        mods: list[Any] = []
        for _ in range(layers):
            mods += [nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)]
        return nn.Sequential(*mods)

    class Block(nn.Module):
        def __init__(self, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)
            self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            hd = c // self.heads
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * hd ** -0.5
            att = att.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    if hidden % 4:
        raise ValueError(f"--hidden {hidden}: the block needs a multiple of 4 (4 attention heads)")
    return nn.Sequential(*[Block() for _ in range(layers)])


class TrainBench:
    """One run's torch side: the device and dtype of ``args``, models, data, the step, check and timing."""

    def __init__(self, args: argparse.Namespace, on_gpu: bool, graphed_warmup: int,
                 tolerance: dict[str, float]) -> None:
        """``graphed_warmup``: graphed_layer's eager steps before its capture; ``tolerance``: the largest relative
        loss/parameter difference counted as correct, per dtype (:mod:`graphjit.bench.train` sets both)."""
        import torch

        self.torch = torch
        self.graphed_warmup = graphed_warmup
        self.tolerance = tolerance
        self.args = args
        self.on_gpu = on_gpu
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
        self.timer = "cuda_events" if on_gpu else "host"

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def model(self, kind: str) -> Any:
        torch = self.torch
        torch.manual_seed(self.args.seed)
        m = build_model(torch, kind, self.args.layers, self.args.hidden, self.args.seq)
        return m.to(self.device, self.dtype)

    def data(self, kind: str, n: int) -> list[tuple[Any, Any]]:
        """``n`` batches of a learnable target (``y = tanh(x @ A)``, ``A`` fixed)."""
        torch = self.torch
        a = self.args
        shape = (a.batch, a.hidden) if kind == "mlp" else (a.batch, a.seq, a.hidden)
        gen = torch.Generator().manual_seed(a.seed + 1)
        proj = torch.randn(a.hidden, a.hidden, generator=gen) / a.hidden ** 0.5
        out = []
        for _ in range(n):
            x = torch.randn(*shape, generator=gen)
            out.append((x.to(self.device, self.dtype), torch.tanh(x @ proj).to(self.device, self.dtype)))
        return out

    def wrap(self, model: Any, variant: str) -> Any:
        import graphjit

        if variant == "eager" or self.args.mode == "step":
            return model
        return graphjit.graphed_layer(model, warmup=self.graphed_warmup,
                                      outputs="alias" if variant == "graphed_alias" else "copy")

    def stepper(self, model: Any, variant: str = "eager") -> Any:
        """The training step of ``model``, as the loop calls it.  Mode ``layer``: ``zero_grad(set_to_none=True)``,
        forward, MSE, backward, SGD (``model`` is graphed_layer's wrapper in the graphed variants).  Mode ``step``:
        one function doing ``zero_grad()``, forward, MSE, backward, ``clip_grad_norm_(1.0)`` and an AdamW step
        with its default flags, a LambdaLR scheduler stepped after each call, the function run eagerly, under
        ``@graphjit.graphed`` or under ``torch.compile(mode="reduce-overhead")``."""
        torch = self.torch
        mse = torch.nn.functional.mse_loss
        if self.args.mode == "layer":
            opt = torch.optim.SGD(model.parameters(), lr=self.args.lr)

            def step(x: Any, y: Any) -> Any:
                opt.zero_grad(set_to_none=True)
                loss = mse(model(x), y)
                loss.backward()
                opt.step()
                return loss

            return step
        import graphjit

        opt = torch.optim.AdamW(model.parameters(), lr=self.args.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1.0 + 0.01 * k))
        params = list(model.parameters())

        def whole(x: Any, y: Any) -> Any:
            opt.zero_grad()
            loss = mse(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss.detach()

        fn = {"eager": whole, "graphed": graphjit.graphed(whole) if variant == "graphed" else whole,
              "compiled": torch.compile(whole, mode="reduce-overhead") if variant == "compiled" else whole}[variant]

        def call(x: Any, y: Any) -> Any:
            loss = fn(x, y)
            sched.step()
            return loss

        call.graphed = fn  # type: ignore[attr-defined]
        return call

    # -- the correctness check ------------------------------------------------------------------
    def check(self, kind: str) -> dict[str, Any]:
        torch = self.torch
        n = self.args.check_steps
        data = self.data(kind, n)
        eager = self.model(kind)
        graphed = self.wrap(copy.deepcopy(eager), "graphed")
        step_e, step_g = self.stepper(eager), self.stepper(graphed, "graphed")
        loss_e, loss_g = [], []
        for x, y in data:
            loss_e.append(step_e(x, y).detach().float())
            loss_g.append(step_g(x, y).detach().float())
        le, lg = torch.stack(loss_e).double().cpu(), torch.stack(loss_g).double().cpu()
        loss_rel = float(((lg - le).abs() / le.abs().clamp_min(1e-30)).max())
        param_rel = 0.0
        layer = graphed.layer if hasattr(graphed, "layer") else graphed
        for p, q in zip(eager.parameters(), layer.parameters()):
            a, b = q.detach().double(), p.detach().double()
            param_rel = max(param_rel, float((a - b).norm() / b.norm().clamp_min(1e-30)))
        tol = self.tolerance[self.args.dtype]
        stats = graphed.stats() if hasattr(graphed, "stats") else step_g.graphed.stats()
        return {"steps": n, "loss_first": float(le[0]), "loss_last": float(le[-1]), "max_loss_rel_diff": loss_rel,
                "max_param_rel_diff": param_rel, "tolerance": tol,
                "correct": bool(loss_rel <= tol and param_rel <= tol),
                "graphed_stats": {k: stats.get(k) for k in ("captures", "replays", "backward_replays", "fallbacks")}}

    # -- timing ---------------------------------------------------------------------------------
    def time_variant(self, kind: str, variant: str) -> dict[str, Any]:
        torch = self.torch
        a = self.args
        if variant == "compiled" and not self.on_gpu:
            return {"status": "skipped", "note": "no CUDA: reduce-overhead's CUDA graphs need a GPU"}
        model = self.wrap(self.model(kind), variant)
        step = self.stepper(model, variant)
        (x, y), = self.data(kind, 1)
        for _ in range(a.warmup):
            step(x, y)
        self.sync()
        samples, host = [], []
        for _ in range(a.repeats):
            if self.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                for _ in range(a.steps):
                    step(x, y)
                end.record()
                t_host = time.perf_counter() - t0
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / a.steps)
            else:
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    step(x, y)
                t_host = time.perf_counter() - t0
                samples.append(t_host * 1e6 / a.steps)
            host.append(t_host * 1e6 / a.steps)
        med = common.median(samples)
        out: dict[str, Any] = {"status": "ok", "us_per_step": med, "samples_us": samples,
                               "host_us_per_step": common.median(host), "timer": self.timer,
                               "spread": (max(samples) - min(samples)) / med if med else None}
        if variant == "compiled":
            pass
        elif variant != "eager":
            stats = model.stats() if self.args.mode == "layer" else step.graphed.stats()
            out["stats"] = {k: stats.get(k) for k in ("calls", "graphs", "captures", "replays", "backward_replays",
                                                     "fallbacks", "pool_bytes")}
            out["captured"] = bool(stats.get("graphs"))
            if self.on_gpu and (not stats.get("graphs") or stats.get("fallbacks")):
                out["status"] = "fallback"
            elif not self.on_gpu:
                out["note"] = "no CUDA: graphed_layer ran the model eagerly (its no-CUDA path)"
        return out
