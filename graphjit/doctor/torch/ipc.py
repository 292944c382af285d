"""graphjit doctor: CUDA IPC between two processes (a GPU 0 tensor shared with a process on GPU 1).

Run in its own process by the ``CUDA IPC`` row of :func:`graphjit.doctor.peers.check_peers`, as
``python -m graphjit.doctor.torch.ipc``: it makes a tensor on GPU 0, hands it to a second (spawned)
process on GPU 1 through a torch multiprocessing queue (``cudaIpcOpenMemHandle``), which doubles it in place
and reads it across GPUs.  It prints one line, :data:`~graphjit.doctor.children.RESULT_MARK` followed by JSON
(``ok``, ``written``, ``peer_read``; or ``error``), and ends with ``os._exit(0)``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, NoReturn

from ..children import RESULT_MARK


def consumer(q: Any, back: Any) -> None:
    """The second process (on GPU 1): double the shared tensor, read it from GPU 1, send back its sum."""
    try:
        import torch
        torch.cuda.set_device(1)
        t = q.get(timeout=60)             # opened through cudaIpcOpenMemHandle
        t.mul_(2)                          # written by this process
        peer = t.to("cuda:1")              # read across GPUs
        torch.cuda.synchronize()
        back.put(("ok", float(peer.sum().item())))
    except BaseException as exc:
        back.put(("error", type(exc).__name__ + ": " + str(exc).strip()[-200:]))


def main() -> NoReturn:
    """Run the probe and report; never returns."""
    result: dict[str, Any] = {"ok": False}
    try:
        import torch
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q, back = ctx.Queue(), ctx.Queue()
        t = torch.arange(1024, dtype=torch.float32, device="cuda:0")
        p = ctx.Process(target=consumer, args=(q, back))
        p.start()
        q.put(t)
        status, value = back.get(timeout=90)
        p.join(30)
        if p.is_alive():
            p.kill()
        torch.cuda.synchronize()
        want = 2 * torch.arange(1024, dtype=torch.float32, device="cuda:0")
        if status != "ok":
            result["error"] = value
        else:
            result["written"] = bool(torch.equal(t, want))
            result["peer_read"] = value == float(want.sum().item())
            result["ok"] = result["written"] and result["peer_read"]
    except BaseException as exc:
        result["error"] = (type(exc).__name__ + ": " + str(exc).strip())[-300:]
        result["traceback"] = traceback.format_exc()[-2000:]
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
