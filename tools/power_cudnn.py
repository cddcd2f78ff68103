"""cuDNN's fused attention (PyTorch SDPA) on prefill_d128_s4096 (BSHD, bf16), launched back to back
for a given number of seconds and timed in blocks of 20 launches: the first block (at the clock
the GPU starts with) against the median (at the clock its power limit allows).
Usage: python3 tools/power_cudnn.py SECONDS [causal]   (tools/power_run.sh runs it)"""
import sys, time, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
b, h, s, d = 4, 16, 4096, 128
mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
sets = [(mk(), mk(), mk()) for _ in range(4)]
flops = 4 * b * h * s * s * d / (2 if causal else 1)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for q, k, v in sets: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    t0 = time.time(); blocks = []
    while time.time() - t0 < secs:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(20):
            q, k, v = sets[i % 4]
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        e1.record(); e1.synchronize()
        blocks.append(e0.elapsed_time(e1) / 20 * 1e3)
print(f"cudnn{' causal' if causal else ''}: blocks {len(blocks)} first {blocks[0]:.1f} us median {sorted(blocks)[len(blocks)//2]:.1f} us last {blocks[-1]:.1f} us min {min(blocks):.1f} -> {flops/sorted(blocks)[len(blocks)//2]/1e6:.0f} TFLOP/s median", flush=True)
