"""Probe: does ``paddle.distributed.all_gather_object`` return the right objects on this GPU?

graphjit's ``collectives.init`` agrees between ranks through ``all_gather_object``.  In Paddle 2.6
that goes through NCCL plus Paddle's own stack/split kernels, and paddlepaddle-gpu 2.6.2 has no
Hopper code for most kernels.  One process, a 1-rank NCCL group on GPU 0: the objects must come
back unchanged (a 1-rank gather still runs the same kernels).  Prints and writes JSON.

Usage (GPU machine, the Paddle kit): ``. /tmp/pdc/env.sh; PYTHONPATH=. $PY311
tools/probes/paddle_all_gather_object_probe.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    a, m = _port(), _port()
    os.environ.update({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "1", "PADDLE_RANK_IN_NODE": "0",
                       "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{a}", "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{a}",
                       "PADDLE_MASTER": f"127.0.0.1:{m}", "FLAGS_selected_gpus": "0"})
    result: dict[str, Any] = {}
    try:
        import paddle
        import paddle.distributed as dist

        result["paddle"] = paddle.__version__
        paddle.set_device("gpu:0")
        dist.init_parallel_env()
        objects = [None, ("unavailable", "x" * 300), {"node": "boot-id", "pci": "0000:1a:00.0", "n": 12345},
                   [b"\x00\x01" * 64, b"h" * 64], 2147483647]
        checks = []
        for obj in objects:
            got: list[Any] = []
            dist.all_gather_object(got, obj)
            checks.append({"sent": repr(obj)[:80], "ok": got == [obj], "got": repr(got)[:120]})
        result["checks"] = checks
        result["ok"] = all(c["ok"] for c in checks)
    except BaseException:
        result["ok"] = False
        result["error"] = traceback.format_exc()[-3000:]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paddle_all_gather_object_probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    sys.stdout.flush()
    os._exit(0 if result.get("ok") else 1)


if __name__ == "__main__":
    main()
