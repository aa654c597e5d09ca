"""Training under ``torch.autocast``: posenc's written-out backward passes run with autocast off
(``posenc.common.amp``), so a backward called inside the autocast region gives the gradients of
one called after it, for every encoding with a custom backward."""

from __future__ import annotations

import pytest
import torch

from posenc.common import chunk_pool
from posenc.seq.models import CausalLM

ENCODINGS = ["rope", "alibi", "t5", "kerple", "fire", "deberta", "shaw", "transformer_xl", "tupe", "cape", "cope",
             "erpe_vector"]


def _grads(encoding: str, backward_inside: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = CausalLM(64, 32, 2, 4, encoding=encoding, max_len=64)
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with chunk_pool.inline():  # the chunks on this thread: they see its autocast state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
    assert logits.dtype == torch.bfloat16  # the forward pass did run under autocast
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_backward_inside_autocast_equals_backward_after_it(encoding):
    inside, after = _grads(encoding, True), _grads(encoding, False)
    assert all(g is not None for g in after)
    for g_in, g_after in zip(inside, after):
        torch.testing.assert_close(g_in, g_after, rtol=0, atol=0)
