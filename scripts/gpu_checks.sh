#!/usr/bin/env bash
# The GPU checks, as one script for a device session (results go to $OUT, or ./gpu-out):
#   1. every kernel path on CUDA against the float64 reference, forward and backward (flex
#      included), for the proving encodings and every relative encoding under every mask;
#   2. the plan each encoding gets on CUDA (path, reason, chunk rows);
#   3. `posenc bench attention` in bf16 at T=4096 and T=16384 with the heavy encodings, whose
#      peak-memory column shows whether any T x T tensor is allocated (a [1, 8, 16384, 16384]
#      bf16 tensor alone would be 4 GiB);
#   4. linear attention and SPE (sine_spe, conv_spe, conv_spe2d) on CUDA against float64 on the
#      CPU with the same noise, causal, padded and packed, and their growth from T=4096 to 16384.
#   5. the round of 2026-12 (torch drop-in masks, NaN padding, video ViT, GPSLayer, peg1d);
#   6. this round (2026-12, second): the Hugging Face bridge in bf16 on CUDA (a Llama with ALiBi
#      through FlexAttention, forward+backward, cached generation equal to uncached; the identity swap
#      against HF's sdpa), the AttentionSmithy method against its StandardAttentionMethod on CUDA,
#      and `posenc bench generate` in bf16 on CUDA at small sizes;
#   7. `posenc bench models` in bf16 autocast on CUDA (eager, and the LM pair compiled), and the
#      backward inside autocast on CUDA;
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -x tests/test_kernel_paths.py -k cuda 2>&1 | tail -n 40 | tee "$out/cuda_tests.txt"
python3 - <<'PY' 2>&1 | tee "$out/plans.txt"
import torch, posenc
from posenc.cli.bench.attention import DEFAULT_ENCODINGS
dims = posenc.ModelDims(dim=512, num_heads=8, max_len=4096)
x = torch.randn(1, 4096, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for name in [n for n in DEFAULT_ENCODINGS if n != "none"]:
    enc = posenc.build(name, dims=dims)
    attn = posenc.MultiheadAttention(512, 8, encoding=None if not (enc.hooks - {posenc.Hook.INPUT}) else enc)
    attn = attn.to("cuda", torch.bfloat16)
    print(f"{name:16s}", attn.plan(x, mask=posenc.AttentionMask(causal=True)))
PY
for t in 4096 16384; do
  python3 -m posenc.cli bench attention --device cuda --dtype bfloat16 --seq-len "$t" --batch 1 --no-peers --no-progress \
    --repeats 3 --warmup 1 --plans \
    --encodings none,rope,alibi,t5,fire,erpe,shaw,transformer_xl,erpe_vector,deberta,cape,cope \
    --json "$out/bench_cuda_T$t.json" 2>&1 | tee "$out/bench_cuda_T$t.txt"
done
python3 - <<'PY' 2>&1 | tee "$out/linear_cuda.txt"
# float32 on CUDA against float64 on CUDA: SPE draws its noise on the device (the same values in
# both precisions, drawn in float32), so the reference must run there too.
import torch, posenc
from posenc.seq import ConvSPE, SineSPE
from posenc.vision import ConvSPE2d
torch.manual_seed(0)
dev = torch.device("cuda")
seg = (torch.arange(300, device=dev) // 70)[None].expand(2, -1)
masks = {"none": None, "causal": posenc.AttentionMask(causal=True),
         "padded": posenc.AttentionMask(causal=True, key_valid=torch.arange(300, device=dev)[None].expand(2, -1) < 250),
         "packed": posenc.AttentionMask.packed(seg)}
grid = torch.stack((torch.arange(300) // 20, torch.arange(300) % 20), -1)[None].to(dev)
for name, enc in [("none", None), ("sine_spe", SineSPE(4, 16, num_realizations=32)),
                  ("conv_spe", ConvSPE(4, 16, num_realizations=32)), ("conv_spe2d", ConvSPE2d(4, 16, num_realizations=32))]:
    for fm in (posenc.EluFeatureMap(), posenc.FavorFeatureMap(32 if enc is not None else 16, seed=0)):
        for mname, mask in masks.items():
            if name == "conv_spe2d" and mname != "none":
                continue
            pos = grid if name == "conv_spe2d" else torch.arange(300, device=dev)[None]
            q, k, v = (torch.randn(2, 4, 300, 16, dtype=torch.float64, device=dev) for _ in range(3))
            e = None if enc is None else enc.to(dev).eval()
            ref = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=None if e is None else e.double(), mask=mask,
                                feature_map=fm.to(dev).double())
            got = posenc.attend(q.float(), k.float(), v.float(), q_pos=pos, kv_pos=pos,
                                encoding=None if e is None else e.float(), mask=mask, feature_map=fm.float())
            err = (got.double() - ref).abs().max().item()
            print(f"{name:10s} {fm.name:6s} {mname:7s} max |fp32 - fp64| on cuda = {err:.2e}", "ok" if err < 1e-3 else "FAIL")
PY
python3 -m posenc.cli bench attention --device cuda --dtype bfloat16 --seq-lens 4096,16384 --batch 4 --no-peers --no-progress \
  --repeats 3 --warmup 1 --plans --encodings none --linear-encodings none,sine_spe,conv_spe \
  --json "$out/bench_cuda_linear.json" 2>&1 | tee "$out/bench_cuda_linear.txt"
# 5. What the 2026-12 round added, on CUDA (each line PASS or FAIL with the reason):
#    TorchMultiheadAttention against torch's layer with float and bool masks (the attn_bias path,
#    FlexAttention on CUDA); NaN in padded keys on every path; the video ViT with the 3D encodings,
#    forward and backward in bf16; GPSLayer with the shortest-path bias; peg1d cached generation.
python3 - <<'PY' 2>&1 | tee "$out/round_2026_12_cuda.txt"
import math, traceback, torch, posenc
from torch import nn
dev = torch.device("cuda")
def check(name, fn):
    try:
        fn(); print(f"PASS {name}")
    except Exception as exc:
        print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
def torch_mha():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 4, batch_first=True).to(dev, torch.float64)
    ours = posenc.TorchMultiheadAttention.from_torch(ref, encoding=None).to(dev, torch.float64)
    x = torch.randn(2, 50, 64, device=dev, dtype=torch.float64)
    for mask in (torch.randn(50, 50, device=dev, dtype=torch.float64), torch.rand(50, 50, device=dev) < 0.3):
        a, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
        b, _ = ours(x, x, x, attn_mask=mask, need_weights=False)
        assert torch.allclose(a, b, atol=1e-9), (a - b).abs().max().item()
def nan_padding():
    for backend in ("sdpa", "dense", "flex", "math"):
        enc = None if backend == "sdpa" else posenc.build("alibi", num_heads=4, symmetric=True)
        q, k, v = (torch.randn(2, 4, 64, 16, device=dev) for _ in range(3))
        valid = torch.arange(64, device=dev)[None].expand(2, -1) < 48
        k[:, :, 48:] = math.nan; v[:, :, 48:] = math.nan
        pos = torch.arange(64, device=dev)[None]
        out = posenc.attend(q, k, v, q_pos=pos, kv_pos=pos, encoding=enc, mask=posenc.AttentionMask(key_valid=valid),
                            backend=backend)
        assert torch.isfinite(out).all(), backend
def video():
    from posenc.vision import ViT
    for enc in ("sincos3d", "axial3d", "rope3d"):
        m = ViT(img_size=32, patch_size=8, in_chans=1, num_classes=4, dim=64, depth=2, num_heads=4, encoding=enc,
                num_frames=8).to(dev)
        with torch.autocast("cuda", torch.bfloat16):
            m(torch.randn(2, 1, 8, 32, 32, device=dev)).float().sum().backward()
def gps_layer():
    from posenc.graph import GPSLayer, ShortestPathBias, node_positions  # first: PyG without its import warning
    from posenc.graph.datasets import csl_dataset
    from torch_geometric.data import Batch
    from torch_geometric.nn import GINConv
    spd = ShortestPathBias(4, max_distance=10)
    layer = GPSLayer(16, GINConv(nn.Linear(16, 16)), 4, encoding=spd).to(dev)
    batch = Batch.from_data_list(csl_dataset(1)).to(dev)
    h = torch.randn(batch.num_nodes, 16, device=dev)
    layer(h, batch.edge_index, batch.batch, positions=node_positions(batch, spd)).sum().backward()
def peg1d_cache():
    from posenc.seq import CausalLM
    m = CausalLM(256, 64, 2, 4, encoding="peg1d", max_len=64).to(dev).eval()
    prompt = torch.randint(0, 256, (2, 8), device=dev)
    full = m.generate(prompt, 8, greedy=True)
    assert full.shape == (2, 16)
for name, fn in [("TorchMultiheadAttention == nn.MultiheadAttention (float and bool masks)", torch_mha),
                 ("NaN in padded keys/values never reaches a real row (sdpa, dense, flex, math)", nan_padding),
                 ("video ViT with sincos3d/axial3d/rope3d, bf16 forward+backward", video),
                 ("GPSLayer with the shortest-path bias, forward+backward", gps_layer),
                 ("CausalLM with peg1d: cached greedy generation", peg1d_cache)]:
    check(name, fn)
PY
# 6. This round's bridges and generation on CUDA (each line PASS or FAIL with the reason).
python3 - <<'PY' 2>&1 | tee "$out/round_2026_12b_cuda.txt"
import copy, traceback, torch, posenc
dev = torch.device("cuda")
def check(name, fn):
    try:
        fn(); print(f"PASS {name}")
    except Exception as exc:
        print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)
def hf_alibi_bf16():
    from posenc.integrations.transformers import register, swap_position_encoding
    register()
    model = swap_position_encoding(tiny_llama(), "alibi").to(dev, torch.bfloat16)
    ids = torch.randint(0, 256, (2, 64), device=dev)
    model(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    with torch.no_grad():
        cached = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0)
        plain = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(cached, plain), (cached != plain).sum().item()
def hf_identity():
    from posenc.integrations.transformers import register, swap_position_encoding
    register()
    ref = tiny_llama().to(dev).eval()
    ours = swap_position_encoding(copy.deepcopy(ref), "identity").eval()
    ids = torch.randint(0, 256, (2, 48), device=dev)
    with torch.no_grad():
        err = (ours(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max().item()
    assert err < 1e-4, err
def smithy_method():
    from attention_smithy.attention import StandardAttentionMethod
    from attention_smithy.components import MultiheadAttention
    from attention_smithy.numeric_embeddings import NumericEmbeddingManager
    from posenc.integrations.attention_smithy import PosencAttentionMethod, strategies
    torch.manual_seed(0)
    manager = NumericEmbeddingManager(strategies("alibi", num_heads=8, options={"symmetric": True})).to(dev)
    ref = MultiheadAttention(256, 8, StandardAttentionMethod(0.0, False)).to(dev)
    ours = copy.deepcopy(ref); ours.attention_method = PosencAttentionMethod()
    x = torch.randn(2, 128, 256, device=dev)
    a, _ = ref(x, x, x, manager, padding_and_loss_attention_mask=None)
    b, _ = ours(x, x, x, manager, padding_and_loss_attention_mask=None)
    assert (a - b).abs().max().item() < 1e-4, (a - b).abs().max().item()
for name, fn in [("HF Llama with ALiBi, bf16 on CUDA: forward+backward, cached generation == uncached", hf_alibi_bf16),
                 ("HF Llama identity swap == HF sdpa on CUDA (float32)", hf_identity),
                 ("AttentionSmithy: PosencAttentionMethod == StandardAttentionMethod with ALiBi on CUDA", smithy_method)]:
    check(name, fn)
PY
python3 -m posenc.cli bench generate --device cuda --dtype bfloat16 --contexts 512,2048 --batches 1,8 --repeats 2 \
  --no-progress --out "$out/generate_bf16" 2>&1 | tail -n 30 | tee "$out/generate_bf16.txt"
# 7. Performance round three (2026-12): the models bench on CUDA in bfloat16 autocast, eager for
#    every pair, then the LM pair compiled (graph breaks and compiled speed-up with FlexAttention);
#    the backward inside autocast on CUDA (posenc.common.amp) for the encodings with a custom backward.
python3 -m posenc.cli bench models --device cuda --dtype bfloat16 --models lm,vit,gps --repeats 3 --no-compile \
  --no-progress --out "$out/models_bf16" 2>&1 | tail -n 30 | tee "$out/models_bf16.txt"
python3 -m posenc.cli bench models --device cuda --dtype bfloat16 --models lm --repeats 3 \
  --no-progress --out "$out/models_bf16_compiled" 2>&1 | tail -n 30 | tee "$out/models_bf16_compiled.txt"
python3 - <<'PY' 2>&1 | tee "$out/autocast_backward_cuda.txt"
import torch
from posenc.seq.models import CausalLM
for enc in ["rope", "alibi", "t5", "kerple", "fire", "deberta", "shaw", "transformer_xl", "tupe", "cape", "cope"]:
    try:
        grads = []
        for inside in (True, False):
            torch.manual_seed(0)
            m = CausalLM(64, 64, 2, 4, encoding=enc, max_len=256).cuda()
            x = torch.randint(0, 64, (2, 200), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(x).float().logsumexp(-1).mean()
                if inside:
                    loss.backward()
            if not inside:
                loss.backward()
            grads.append([p.grad for p in m.parameters()])
        same = all(torch.equal(a, b) for a, b in zip(*grads))
        print(f"{'PASS' if same else 'FAIL'} {enc}: backward inside autocast {'==' if same else '!='} after it")
    except Exception as exc:
        print(f"FAIL {enc}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
PY
