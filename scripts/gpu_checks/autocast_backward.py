"""The backward inside autocast equals the backward after it, to float32 rounding, (posenc.common.amp) for the encodings
with a custom backward, in bf16 on the device."""

from __future__ import annotations

import torch
from _common import DEVICE, check, finish

from posenc.common import chunk_pool
from posenc.seq.models import CausalLM


def same_gradients(enc: str) -> None:
    grads = []
    for inside in (True, False):
        torch.manual_seed(0)
        m = CausalLM(64, 64, 2, 4, encoding=enc, max_len=256).to(DEVICE)
        x = torch.randint(0, 64, (2, 200), device=DEVICE)
        with chunk_pool.inline():  # CPU chunks on this thread: they see its autocast state, in a fixed order
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = m(x).float().logsumexp(-1).mean()
                if inside:
                    loss.backward()
            if not inside:
                loss.backward()
        grads.append([p.grad for p in m.parameters()])
    # Not bit-equal: index_add_ and atomics order sums differently from run to run (1e-7 relative);
    # a backward under autocast would differ at bf16's 1e-2.
    worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(*grads))
    assert worst < 1e-4, f"a gradient differs by {worst:.1e} of its largest entry"


for enc in ["rope", "alibi", "t5", "kerple", "fire", "deberta", "shaw", "transformer_xl", "tupe", "cape", "cope"]:
    check(f"{enc}: backward inside bf16 autocast == after it", lambda enc=enc: same_gradients(enc))
finish()
