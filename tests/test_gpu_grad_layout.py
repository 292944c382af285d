"""GPU twins of tests/test_grad_layout.py (make test-gpu): the same training loops through real CUDA graphs, fp32
matmuls without TF32, against the same loops run eagerly: a parameter frozen after the capture, a step whose backward
runs outside it, a step that ends with ``zero_grad()``, a task's unused head, a key first called after another key's
calls, a forward and backward graphed apart from an eager optimizer, and an update graphed apart from its graphed
micro-batches (whose capture left the parameters one step behind before e939403)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_grad_layout import (  # noqa: E402, F401
    test_a_forward_and_backward_graphed_apart_from_an_eager_optimizer_accumulates_as_eagerly,
    test_a_key_first_called_after_another_keys_calls_owns_the_gradients_it_writes,
    test_a_parameter_frozen_after_the_capture_runs_uncaptured_and_reset_graphs_again,
    test_a_step_that_ends_with_zero_grad_leaves_no_gradient_as_eagerly,
    test_a_step_whose_backward_runs_outside_never_reads_stale_gradients,
    test_an_update_graphed_apart_from_its_graphed_micro_batches_captures_and_equals_eager,
    test_the_head_a_task_leaves_unused_has_no_gradient_after_its_replays,
)

pytestmark = [pytest.mark.gpu, pytest.mark.torch]


@pytest.fixture
def emu():
    """Real graphs here: nothing emulated."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield None
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def device() -> str:
    return "cuda"


@pytest.fixture
def tol() -> float:
    return 1e-5
