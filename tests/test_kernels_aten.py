"""The private aten kernels the dense path calls keep the signatures posenc was written for.

If torch renames or changes them, this fails with the old and new schema side by side, instead of
the dense path failing (or, worse, passing arguments in the wrong places) at run time."""

from __future__ import annotations

import torch

from posenc.common import kernels


def _schema(op) -> str:
    return str(op.default._schema)


def test_cpu_flash_forward_signature_is_the_one_wrapped():
    found = _schema(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    assert found == kernels.CPU_FLASH_FORWARD_SCHEMA, f"torch changed it:\n  expected {kernels.CPU_FLASH_FORWARD_SCHEMA}\n  found    {found}"


def test_cpu_flash_backward_signature_is_the_one_wrapped():
    found = _schema(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)
    assert found == kernels.CPU_FLASH_BACKWARD_SCHEMA, f"torch changed it:\n  expected {kernels.CPU_FLASH_BACKWARD_SCHEMA}\n  found    {found}"


def test_wrappers_compute_attention_and_its_gradient():
    """The wrappers against plain autograd of softmax(QK^T * s + bias) V, in float64."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 3, 7, 7, dtype=torch.float64, generator=gen)
    scale = 0.3
    scores = q @ k.transpose(-1, -2) * scale + bias
    want = torch.softmax(scores, -1) @ v
    out, lse = kernels.cpu_flash_forward(q.detach(), k.detach(), v.detach(), bias, scale)
    torch.testing.assert_close(out, want.detach())
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).detach())
    grad = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    dq, dk, dv = kernels.cpu_flash_backward(grad, q.detach(), k.detach(), v.detach(), out, lse, bias, scale)
    for got, expected in zip((dq, dk, dv), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(got, expected)
