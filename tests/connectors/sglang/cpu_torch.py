"""Running SGLang 0.5.23's cache classes on a CPU-only torch, in this process (tier set-up, not a fake).

- torchvision: SGLang's model configs import it, and the registry's torchvision is linked against CUDA
  torch, so its operator library does not load here; torchvision 0.28 still registers fake kernels
  for ``torchvision::nms`` / ``qnms`` at import, which fails for operators that do not exist. Declaring
  the two schemas (no kernel) lets it import; nothing in SGLang's cache calls them.
- a gloo process group of one, held in memory (no sockets), for the controller's rank collectives;
- SGLang's parallel context (normally published by its launcher): rank 0 of one, no DCP.
"""

from __future__ import annotations

import functools
import importlib.util

import torch


def _declare_torchvision_ops() -> None:
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        torch.ops.torchvision.nms.default  # noqa: B018 - does the operator exist?
    except (AttributeError, RuntimeError):
        pass
    else:
        return
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _libraries.append(library)


_libraries: list[torch.library.Library] = []


@functools.cache
def prepare_sglang() -> None:
    """Make SGLang's cache classes importable and runnable here (once per process)."""
    _declare_torchvision_ops()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_rank=0, attn_dcp_size=1
    )
