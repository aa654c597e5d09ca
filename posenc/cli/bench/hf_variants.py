"""The variants of ``posenc bench hf`` (see :mod:`.hf` for the command): one Hugging Face Llama
per variant from the same seed, trained on pydoc byte windows, then scored in bits per byte at
each length and timed in cached generation."""

from __future__ import annotations

import argparse
import math
import time

import torch

from ...training.report import Progress


def device_of(name: str) -> torch.device:
    """The device of ``--device`` (``auto``: CUDA when torch sees it, else the CPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model(args: argparse.Namespace, variant: str, max_len: int, swap: bool):
    """A fresh Llama (same seed for all), with ``variant`` swapped in when ``swap``."""
    import transformers  # the command checked it is installed

    from ...integrations.transformers import register, swap_position_encoding

    register()
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=args.dim, intermediate_size=int(8 * args.dim / 3 + 63) // 64 * 64,
        num_hidden_layers=args.depth, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=max_len, pad_token_id=0, bos_token_id=0, eos_token_id=None, tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(config)
    if swap:
        swap_position_encoding(model, variant)
    return model


def _train(model, args, train_text: str, device: torch.device, progress: Progress) -> tuple[float, float]:
    """``(tokens per second, final loss)`` of ``--steps`` AdamW steps on random windows."""
    from ...seq.data import ByteWindows

    windows = ByteWindows(train_text, args.train_len)
    generator = torch.Generator().manual_seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    model.train()
    autocast = args.dtype == "bfloat16"
    timed_tokens, timed_s, loss_value = 0, 0.0, float("nan")
    for step in range(args.steps):
        idx = torch.randint(len(windows), (args.batch_size,), generator=generator).tolist()
        x = torch.stack([windows[i][0] for i in idx]).to(device)
        y = torch.stack([windows[i][1] for i in idx]).to(device)
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        _sync(device)
        if step >= min(3, args.steps - 1):  # the first steps warm the allocator and kernels up
            timed_s += time.perf_counter() - t0
            timed_tokens += x.numel()
        loss_value = loss.item()
        progress.update(note=f"loss {loss_value:.3f}")
    return timed_tokens / max(timed_s, 1e-9), loss_value


@torch.no_grad()
def _bits_per_byte(model, text: str, length: int, tokens: int, device: torch.device, batch: int) -> float:
    from ...seq.data import eval_windows

    x, y = eval_windows(text, length, tokens)
    total, count = 0.0, 0
    for i in range(0, x.shape[0], batch):
        logits = model(input_ids=x[i:i + batch].to(device), use_cache=False).logits.float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[i:i + batch].to(device).flatten(),
                                                   reduction="sum").item()
        count += y[i:i + batch].numel()
    return total / count / math.log(2)


@torch.no_grad()
def _generation_speed(model, args, text: str, device: torch.device) -> float:
    """New tokens per second of cached greedy generation from ``--gen-batch`` prompts."""
    from ...seq.data import eval_windows

    prompts, _ = eval_windows(text, min(32, args.train_len), args.gen_batch * min(32, args.train_len))
    prompts = prompts[: args.gen_batch].to(device)
    config = dict(max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens, do_sample=False, use_cache=True,
                  pad_token_id=0)
    model.generate(prompts, **{**config, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(prompts, **config)
    _sync(device)
    return (out.shape[1] - prompts.shape[1]) * prompts.shape[0] / (time.perf_counter() - t0)


def measure_variant(args: argparse.Namespace, variant: str, train_text: str, valid_text: str, device: torch.device,
                    *, swap: bool) -> dict:
    """Build, train and measure one variant (``swap``: posenc's ``variant`` swapped into the Llama,
    else the model as Hugging Face ships it): its row of the table (tokens/s, loss, bits per byte)."""
    lengths = [f * args.train_len for f in args.eval_factors]
    model = _model(args, variant, max(lengths), swap).to(device)
    progress = Progress(args.steps, f"{variant}", enabled=not args.no_progress)
    train_tps, loss = _train(model, args, train_text, device, progress)
    progress.close()
    model.eval()
    bpb = {str(n): round(_bits_per_byte(model, valid_text, n, args.eval_tokens, device, args.batch_size), 4)
           for n in lengths}
    gen_tps = _generation_speed(model, args, valid_text, device)
    return {"variant": variant, "attn_implementation": model.config._attn_implementation,
            "train_tokens_per_s": round(train_tps, 1), "generate_tokens_per_s": round(gen_tps, 1),
            "train_loss": round(loss, 4), "bits_per_byte": bpb}


__all__ = ["device_of", "measure_variant"]
