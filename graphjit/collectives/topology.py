"""Which GPUs of a node may run the custom all-reduce together.

Rules (checked at ``collectives.init``, the same on every rank because every rank looks at the
same GPUs, given by their PCI bus ids):

* every pair of GPUs has peer-to-peer access (NVML's P2P read status, or CUDA's
  ``cudaDeviceCanAccessPeer`` when both devices are visible to this process);
* above 2 GPUs, every pair is connected by NVLink (NVML's per-pair NVLink P2P status, not the
  link state of each link: the latter reports false positives on some systems).  Over PCIe the
  one-shot algorithm's all-to-all reads are slower than NCCL's ring;
* no two ranks share one GPU (unless ``GRAPHJIT_AR_SHARED_GPU=1``, for testing the multi-process
  path on one GPU: ranks on the same GPU need no P2P between them, and their kernels take turns).

A pair whose status cannot be read (no NVML, device not visible) counts as unknown: for 2 GPUs
the write-and-verify probe at init decides, above 2 an unknown NVLink status is a "topology"
fallback.  NVML is loaded with ctypes (``libnvidia-ml.so.1``); nothing is installed for it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence

Reason = tuple[str, str]
Matrix = list[list[bool | None]]

_NVML_P2P_CAPS_INDEX_READ = 0
_NVML_P2P_CAPS_INDEX_NVLINK = 2
_NVML_P2P_STATUS_OK = 0

_lock = threading.Lock()


def _nvml() -> tuple[ctypes.CDLL | None, str | None]:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return None, f"NVML is not available ({exc})"
    return lib, None


def nvml_matrices(pci_ids: Sequence[str]) -> tuple[Matrix, Matrix, str | None]:
    """``(p2p, nvlink, problem)`` for the GPUs with these PCI bus ids; unknown entries are None."""
    n = len(pci_ids)
    p2p: Matrix = [[True if i == j else None for j in range(n)] for i in range(n)]
    nvlink: Matrix = [[True if i == j else None for j in range(n)] for i in range(n)]
    lib, problem = _nvml()
    if lib is None:
        return p2p, nvlink, problem
    with _lock:
        init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
        if init is None or init() != 0:
            return p2p, nvlink, "nvmlInit failed"
        try:
            handles = []
            by_pci = getattr(lib, "nvmlDeviceGetHandleByPciBusId_v2", None) or lib.nvmlDeviceGetHandleByPciBusId
            for pci in pci_ids:
                h = ctypes.c_void_p()
                if by_pci(pci.encode(), ctypes.byref(h)) != 0:
                    return p2p, nvlink, f"NVML does not know the GPU at {pci}"
                handles.append(h)
            status = ctypes.c_int()
            for i in range(n):
                for j in range(n):
                    if i == j:
                        continue
                    for matrix, index in ((p2p, _NVML_P2P_CAPS_INDEX_READ), (nvlink, _NVML_P2P_CAPS_INDEX_NVLINK)):
                        rc = lib.nvmlDeviceGetP2PStatus(handles[i], handles[j], index, ctypes.byref(status))
                        matrix[i][j] = (status.value == _NVML_P2P_STATUS_OK) if rc == 0 else None
        finally:
            lib.nvmlShutdown()
    return p2p, nvlink, None


def merge_cuda_peer(p2p: Matrix, pci_ids: Sequence[str], can_access: Callable[[str, str], int]) -> Matrix:
    """Fill unknown P2P entries from CUDA (``can_access`` returns 1, 0, or -1 for not visible)."""
    out = [row[:] for row in p2p]
    for i, a in enumerate(pci_ids):
        for j, b in enumerate(pci_ids):
            if out[i][j] is None:
                try:
                    value = can_access(a, b)
                except Exception:
                    value = -1
                out[i][j] = None if value < 0 else bool(value)
    return out


def _same_gpu(a: str, b: str) -> bool:
    return a.lower().lstrip("0") == b.lower().lstrip("0")


def verdict(pci_ids: Sequence[str], p2p: Matrix, nvlink: Matrix, nvml_problem: str | None = None,
            allow_shared: bool = False) -> Reason | None:
    """None if these GPUs may run the custom all-reduce together, else ``("topology", why)``.

    ``allow_shared`` (``GRAPHJIT_AR_SHARED_GPU=1``, testing only): ranks may share a GPU; pairs of
    ranks on one GPU need neither P2P nor NVLink.
    """
    n = len(pci_ids)
    if not allow_shared:
        for i in range(n):
            for j in range(i):
                if _same_gpu(pci_ids[i], pci_ids[j]):
                    return "topology", (f"ranks {j} and {i} use the same GPU ({pci_ids[i]}); one GPU per rank "
                                        "(GRAPHJIT_AR_SHARED_GPU=1 allows sharing, for tests only)")
    for i in range(n):
        for j in range(n):
            if i == j or _same_gpu(pci_ids[i], pci_ids[j]):
                continue
            if p2p[i][j] is False:
                return "topology", f"no peer-to-peer access from GPU {pci_ids[i]} (rank {i}) to {pci_ids[j]} (rank {j})"
    if n > 2:
        for i in range(n):
            for j in range(n):
                if i == j or _same_gpu(pci_ids[i], pci_ids[j]):
                    continue
                if nvlink[i][j] is False:
                    return "topology", (f"GPUs {pci_ids[i]} (rank {i}) and {pci_ids[j]} (rank {j}) are not connected "
                                        "by NVLink; above 2 GPUs the custom all-reduce needs NVLink between all pairs")
                if nvlink[i][j] is None:
                    why = f" ({nvml_problem})" if nvml_problem else ""
                    return "topology", (f"NVLink between GPUs {pci_ids[i]} and {pci_ids[j]} could not be verified"
                                        f"{why}; above 2 GPUs the custom all-reduce needs NVLink between all pairs")
    return None


def nodes_verdict(nodes: Sequence[str], names: Sequence[str] | None = None) -> Reason | None:
    """None if every rank runs on one node (``nodes``: a node identity per rank; ``names``: host names)."""
    distinct = sorted(set(nodes))
    if len(distinct) > 1:
        shown = sorted(set(names)) if names else distinct
        return "multi-node", (f"the group spans {len(distinct)} nodes ({', '.join(shown[:4])}); "
                              "CUDA IPC needs one node")
    return None
