"""Probe (GPU): why graphed_layer on transformers' Llama ends a few steps off eager, and whether any update is missed
or doubled.  A 2-layer random-weight Llama (hidden 256, fp32, TF32 off) trains 8 steps under ``graphed_layer`` and
eagerly from the same weights and data, once with SGD and once with AdamW.  Per step: the largest relative difference
of the gradients (what the graph computed) and the largest absolute difference of the parameters, and the size of one
update (a missed or doubled update would put the parameter difference at that size).  Also eager against eager
(bitwise, the premise).  Usage: ``python3 tools/probes/graphed_layer_llama.py``; prints one JSON line per run."""

from __future__ import annotations

import copy
import json

import torch
import transformers

import graphjit


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).cuda().train()


class Loss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=ids, use_cache=False).loss


def run(opt_name: str, graph: bool, steps: int = 8):
    base = build()
    eager_model = copy.deepcopy(base)
    net = Loss(base)
    trained = graphjit.graphed_layer(net) if graph else Loss(eager_model)
    params = list((net if graph else trained).parameters())
    cls = torch.optim.SGD if opt_name == "sgd" else torch.optim.AdamW
    opt = cls(params, lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, 512, (4, 32), generator=gen).cuda()
        opt.zero_grad(set_to_none=True)
        loss = trained(ids)
        loss.backward()
        grads = [p.grad.detach().clone() if p.grad is not None else None for p in params]
        before = [p.detach().clone() for p in params]
        opt.step()
        upd = max(float((p.detach() - b).abs().max()) for p, b in zip(params, before))
        out.append({"loss": float(loss), "grads": grads, "params": [p.detach().clone() for p in params],
                    "update": upd})
    return out, (trained.stats() if graph else None)


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    for opt_name in ("sgd", "adamw"):
        ref, _ = run(opt_name, graph=False)
        again, _ = run(opt_name, graph=False)
        got, st = run(opt_name, graph=True)
        eager_eager = max(float((a - b).abs().max()) for x, y in zip(ref, again)
                          for a, b in zip(x["params"], y["params"]))
        rows = []
        for k, (r, g) in enumerate(zip(ref, got)):
            grad_rel = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(g["grads"], r["grads"])
                           if a is not None and b is not None)
            param_abs = max(float((a - b).abs().max()) for a, b in zip(g["params"], r["params"]))
            rows.append({"step": k + 1, "loss_diff": abs(g["loss"] - r["loss"]), "grad_rel": grad_rel,
                         "param_abs": param_abs, "update": r["update"]})
        print(json.dumps({"optimizer": opt_name, "eager_vs_eager_param_abs": eager_eager, "steps": rows,
                          "graphed": {k: st.get(k) for k in ("captures", "replays", "backward_replays", "fallbacks")}}),
              flush=True)


if __name__ == "__main__":
    main()
