import time, torch
torch.set_num_threads(1)
B,H,n,d,k=8,4,513,64,256
kbuf=torch.randn(B,H,1024,d); keys=kbuf[:,:,:n]
rows=torch.randn(B,H,1,d); kr_by_dim=torch.randn(H,d,2*k); qr=torch.randn(H,2*k,d)
from posenc.seq.deberta import _few_rows_linear
from posenc.common.pairwise import rows_times_table

shift = -(n - 1) + k  # offset + span: the query is the newest of n tokens
def t(f, *a, **kw):
    for _ in range(5): f(*a, **kw)
    t0=time.perf_counter()
    for _ in range(300): f(*a, **kw)
    return (time.perf_counter()-t0)/300*1e6
print("few_rows_linear", t(_few_rows_linear, rows, keys, kr_by_dim, qr, shift, far_products=False))
print("c2p rows_times_table", t(rows_times_table, rows, kr_by_dim[..., 255:]))
a,b=n-k,n; s=shift
print("p2c mul+sum", t(lambda: (keys[:, :, a:b] * qr[:, a+s:b+s]).sum(-1)))
