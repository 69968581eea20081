"""A test-only stand-in for SGLang's kernel package on a CPU (it never ships).

PyPI's ``sglang-kernel`` holds CUDA kernels only and fails to import without
``libcuda.so.1``; SGLang's CPU build of it is not on PyPI. With torch-native attention on
a CPU without AMX, SGLang only imports a few of its names at module level. This package,
first on the real server's ``PYTHONPATH``, offers exactly those names. Each is a function
that records its call (one JSON line: process id and name) in the file that
``QUEUE_ROLLOUT_STAND_IN_LOG`` names, then raises: the real-engine tier fails if that file
holds a line, so no test passes on something this package pretended to compute. It
registers nothing under ``torch.ops.sgl_kernel``, so SGLang's AMX checks stay false.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import NoReturn

LOG_ENV = "QUEUE_ROLLOUT_STAND_IN_LOG"


def recorded(name: str) -> Callable[..., NoReturn]:
    """A function named *name* that records its call and raises."""

    def call(*args: object, **kwargs: object) -> NoReturn:
        path = os.environ.get(LOG_ENV)
        if path:
            with open(path, "a") as log:
                log.write(json.dumps({"pid": os.getpid(), "name": name}) + "\n")
        raise NotImplementedError(f"the sgl_kernel stand-in was called: {name}")

    call.__name__ = call.__qualname__ = name
    return call


copy_all_layer_kv_cache_cpu = recorded("copy_all_layer_kv_cache_cpu")
assign_req_to_token_pool_cpu = recorded("assign_req_to_token_pool_cpu")
build_tree_kernel_efficient_cpu = recorded("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = recorded("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = recorded("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = recorded("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = recorded("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = recorded("fill_bonus_tokens_cpu")
