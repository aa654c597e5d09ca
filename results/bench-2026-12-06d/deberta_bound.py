# Upper bound of what keeping DeBERTa's within-span p2c products could save: the step with those
# products replaced by a free read (wrong values; timing only)
import time, torch
torch.set_num_threads(1)
import posenc.seq.deberta as D
from posenc.seq.models import CausalLM
from posenc.common.decoding_state import DecodingState

def step_ms(m, x):
    with torch.no_grad():
        cache = m.new_cache(); st = DecodingState(4)
        m(x, cache=cache, decoding_state=st); tok = x[:, -1:]
        for _ in range(3): m(tok, cache=cache, decoding_state=st); cache.crop(x.shape[1])
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(8): m(tok, cache=cache, decoding_state=st); cache.crop(x.shape[1])
            ts.append((time.perf_counter() - t0) / 8 * 1e3)
        return sorted(ts)[2]

torch.manual_seed(0)
x = torch.randint(0, 256, (8, 512))
rope = CausalLM(256, dim=256, depth=4, num_heads=4, encoding="rope", max_len=4096).eval()
deb = CausalLM(256, dim=256, depth=4, num_heads=4, encoding="deberta", max_len=4096).eval()
for rnd in range(2):
    a, b = step_ms(rope, x), step_ms(deb, x)
    orig = D._few_rows_linear
    def free(rows, keys, kr_by_dim, qr, shift, far_products=True):
        n = keys.shape[2]
        return keys.new_zeros(keys.shape[0], keys.shape[1], rows.shape[2], n)
    D._few_rows_linear = free
    c = step_ms(deb, x)
    D._few_rows_linear = orig
    print(f"round {rnd}: rope {a:.2f} ms, deberta {b:.2f} ms ({a/b:.2f}x rope), deberta without _few_rows_linear {c:.2f} ms ({a/c:.2f}x rope)")
