#!/usr/bin/env python3
"""Time PyTorch's attention backends on the project's shape suite, plus two hardware ceilings.

The stages are only interesting next to what a user already has, so this script measures PyTorch's
scaled_dot_product_attention with each of its fused backends pinned in turn:

    sdpa_flash      SDPBackend.FLASH_ATTENTION       (FlashAttention-2)
    sdpa_efficient  SDPBackend.EFFICIENT_ATTENTION   (memory-efficient, xFormers' kernel)
    sdpa_cudnn      SDPBackend.CUDNN_ATTENTION       (cuDNN's fused attention)

and, in the same run, the two ceilings every figure is compared with: a device-to-device copy (GB/s)
and a bf16 matmul (TFLOP/s); for each decode shape also a copy of the shape's own byte count
(`copy/<shape>`), the ceiling at that size. Measuring them here rather than quoting the datasheet keeps the
percentages honest for this GPU, clock and driver.

The shapes come from the C++ binary (`attn_runner --shapes-json > shapes.json`), so the suite is
defined in one place only. The output is Google Benchmark's JSON schema with names
`<peer>/<shape>`, as the stages' are `<stage>/<shape>`, so tools/plot.py reads it like bench.json.

Timing follows the C++ harness (common/timer.h), with its constants: warm-up, then samples of n
back-to-back launches with n chosen so a sample lasts at least 2 ms, CUDA events around each
sample, up to 100 samples in about a second, the median reported. The window matters: a GPU slows
its clock when a kernel draws its power limit, a few hundred milliseconds in, so a peer sampled
over a shorter window than the stages would be timed at a higher clock. Latency-bound
shapes (`graph: true`) are launched from a CUDA graph, because Python's launch overhead (tens of
µs) would otherwise be what we measure.

    python3 tools/peers.py --shapes shapes.json --out results/h200/peers.json \
        [--commit SHA] [--only NAME_SUBSTRING]

Needs a CUDA GPU and PyTorch (tools/requirements-peers.txt); only the standard library otherwise.
"""

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import re
import warnings
from datetime import datetime

WARMUP_LAUNCHES = 3
TARGET_SAMPLE_MS = 2.0      # as the C++ harness: outlasts event resolution and launch jitter
MIN_SAMPLES = 10
MAX_SAMPLES = 100
SAMPLING_BUDGET_S = 1.0     # stop taking samples after this long, once MIN_SAMPLES are in
CALIBRATION_ROUNDS = 4

# Input sets are only worth having while they fit comfortably; beyond this share of free memory we
# use fewer (big shapes already overflow L2 with one set, so little is lost).
INPUT_SET_MEMORY_SHARE = 0.5

COPY_BYTES = 1 << 30        # 1 GiB: far beyond L2, so the copy streams from HBM
MATMUL_N = 8192             # large enough that cuBLAS reaches its steady-state peak

PEERS = (
    ("sdpa_flash", "FLASH_ATTENTION"),
    ("sdpa_efficient", "EFFICIENT_ATTENTION"),
    ("sdpa_cudnn", "CUDNN_ATTENTION"),
)

NAME_WIDTH = 48
TRIGGERED_AT = re.compile(r"\s*\(Triggered internally at [^)]*\)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Time PyTorch SDPA backends and the copy/matmul ceilings on the shape suite.")
    parser.add_argument("--shapes", required=True,
                        help="shape suite from `attn_runner --shapes-json` (JSON)")
    parser.add_argument("--out", required=True, help="output JSON, e.g. results/h200/peers.json")
    parser.add_argument("--commit", default=None,
                        help="commit measured (default: $ATTN_COMMIT, else the checkout's commit)")
    parser.add_argument("--only", default=None,
                        help="only shapes whose name contains this substring (quick runs)")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------

def round_up(value, multiple):
    return -(-value // multiple) * multiple


def time_launches(torch, launch, num_sets, use_graph):
    """Median time of one launch, as (microseconds, samples taken, launches per sample).

    `launch(i)` issues one launch reading input set `i`. Sets are used in round-robin order so that
    consecutive launches do not find their inputs already in L2.
    """
    # Warm up on a side stream: the first calls choose kernels, build cuDNN plans and grow the
    # allocator's pool, none of which may happen during graph capture (and none of which we want
    # to time). PyTorch's CUDA-graph notes ask for exactly this.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(WARMUP_LAUNCHES):
            launch(i % num_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    next_set = 0

    def eager(n):
        def run():
            nonlocal next_set
            for _ in range(n):
                launch(next_set)
                next_set = (next_set + 1) % num_sets
        return run

    def graphed(n):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                launch(i % num_sets)
        graph.replay()  # the first replay uploads the graph; keep that out of the samples
        return graph.replay

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def sample_ms(run):
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    # A graph replays the same n launches every time; making n a multiple of the number of sets
    # keeps the rotation seamless from one replay to the next.
    build = graphed if use_graph else eager
    quantum = num_sets if use_graph else 1

    # n = ceil(2 ms / t_single). A single launch's time is inflated by launch latency, so n comes
    # out too small at first; re-measure with the new n until it stops growing.
    n = quantum
    run = build(n)
    for _ in range(CALIBRATION_ROUNDS):
        per_launch_ms = max(sample_ms(run) / n, 1e-6)
        wanted = round_up(max(1, math.ceil(TARGET_SAMPLE_MS / per_launch_ms)), quantum)
        if wanted <= n:
            break
        n = wanted
        run = None  # let a previous graph go before capturing the next one
        run = build(n)

    samples_ms = []
    began = time.perf_counter()
    while len(samples_ms) < MAX_SAMPLES:
        samples_ms.append(sample_ms(run) / n)
        if len(samples_ms) >= MIN_SAMPLES and time.perf_counter() - began >= SAMPLING_BUDGET_S:
            break
    return statistics.median(samples_ms) * 1e3, len(samples_ms), n


# ----------------------------------------------------------------------------------------------
# Result entries (Google Benchmark's schema)
# ----------------------------------------------------------------------------------------------

def ok_entry(name, time_us, samples, launches_per_sample, flops=None, num_bytes=None, **extra):
    seconds = time_us * 1e-6
    entry = {
        "name": name,
        "run_name": name,
        "run_type": "iteration",
        "iterations": samples,
        "real_time": time_us,
        "cpu_time": time_us,  # GPU time; Google Benchmark's schema wants the field
        "time_unit": "us",
    }
    if flops is not None:
        entry["TFLOPs"] = flops / seconds / 1e12
    if num_bytes is not None:
        entry["GBps"] = num_bytes / seconds / 1e9
    entry["launches_per_sample"] = launches_per_sample
    entry.update(extra)
    return entry


def error_entry(name, message):
    return {
        "name": name,
        "run_name": name,
        "run_type": "iteration",
        "error_occurred": True,
        "error_message": message,
        "iterations": 0,
        "real_time": 0,
        "cpu_time": 0,
        "time_unit": "us",
    }


def describe_failure(exc, caught_warnings):
    """The exception plus the warnings PyTorch emitted on the way.

    When SDPA refuses a shape it raises only "No available kernel"; the reason (head dim, GQA,
    dtype, ...) is in the UserWarnings it printed just before, so those go into the message too.
    """
    reasons = []
    for w in caught_warnings:
        # Drop the C++ source locations PyTorch appends, and the notes about the backends we
        # disabled ourselves: they crowd out the one reason that matters.
        text = " ".join(TRIGGERED_AT.sub("", str(w.message)).split())
        if text and "runtime disabled" not in text and text not in reasons:
            reasons.append(text)
    # A heading ("... not used because:") is only worth keeping with a reason after it.
    def is_heading(i):
        return reasons[i].endswith(":")

    reasons = [text for i, text in enumerate(reasons)
               if not is_heading(i) or (i + 1 < len(reasons) and not is_heading(i + 1))]
    first_line = (str(exc).strip().splitlines() or [""])[0]
    message = " | ".join([f"{type(exc).__name__}: {first_line}"] + reasons)
    return message if len(message) <= 800 else message[:797] + "..."


def print_header():
    print(f"{'name':<{NAME_WIDTH}} {'us':>11} {'TFLOP/s':>9} {'GB/s':>9}", flush=True)


def print_entry(entry):
    name = entry["name"]
    if entry.get("error_occurred"):
        print(f"{name:<{NAME_WIDTH}} error: {entry['error_message'][:100]}", flush=True)
        return

    def counter(key):
        value = entry.get(key)
        return f"{value:9.1f}" if value is not None else f"{'-':>9}"

    print(f"{name:<{NAME_WIDTH}} {entry['real_time']:11.2f} {counter('TFLOPs')} {counter('GBps')}",
          flush=True)


def free_cuda_memory(torch):
    try:
        torch.cuda.synchronize()
    except Exception:
        pass  # a sticky CUDA error: nothing to free, and the next launch will report it
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------

def copy_ceiling(torch):
    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    time_us, samples, n = time_launches(torch, lambda i: dst.copy_(src), 1, use_graph=False)
    # A copy reads and writes every byte once: count both, as the stages' bandwidth figures do
    # (Q, K, V read plus O written).
    return ok_entry("ceiling/copy", time_us, samples, n, num_bytes=2 * COPY_BYTES)


def matmul_ceiling(torch):
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    time_us, samples, n = time_launches(torch, lambda i: torch.mm(a, b, out=c), 1, use_graph=False)
    return ok_entry("ceiling/matmul_bf16", time_us, samples, n, flops=2 * MATMUL_N ** 3)


def copy_of_shape(torch, shape):
    """`copy/<shape>`: a device-to-device copy that moves as many bytes as the shape (read plus
    written), from as many rotated sources as the shape has input sets. This is the copy ceiling
    at the shape's size: a short launch cannot amortise its ramp and tail the way the 1 GiB copy
    does, so a memory-bound kernel of this size is compared with it as well as with the ceiling."""
    name = f"copy/{shape['name']}"
    try:
        n = max(1, int(shape["bytes"]) // 4)  # bf16 elements read, and as many written
        sources = [torch.randn(n, device="cuda", dtype=torch.bfloat16)
                   for _ in range(max(1, int(shape.get("input_sets", 1))))]
        dst = torch.empty_like(sources[0])
        time_us, samples, count = time_launches(torch, lambda i: dst.copy_(sources[i]),
                                                len(sources), shape["graph"])
        entry = ok_entry(name, time_us, samples, count, num_bytes=4 * n,
                         input_sets=len(sources))
    except Exception as exc:
        entry = error_entry(name, describe_failure(exc, []))
    free_cuda_memory(torch)
    print_entry(entry)
    return entry


def measure_ceilings(torch):
    entries = []
    for name, measure in (("ceiling/copy", copy_ceiling), ("ceiling/matmul_bf16", matmul_ceiling)):
        try:
            entries.append(measure(torch))
        except Exception as exc:
            entries.append(error_entry(name, describe_failure(exc, [])))
        free_cuda_memory(torch)  # the tensors died with measure(); hand their memory back
        print_entry(entries[-1])
    return entries


def make_tensor(torch, shape, seq_len, heads, dtype):
    """One of Q, K, V stored in the shape's layout, returned as the [B, H, S, D] view SDPA takes."""
    b, d = shape["b"], shape["d"]
    if shape["layout"] == "BSHD":
        return torch.randn(b, seq_len, heads, d, device="cuda", dtype=dtype).transpose(1, 2)
    if shape["layout"] == "BHSD":
        return torch.randn(b, heads, seq_len, d, device="cuda", dtype=dtype)
    raise ValueError(f"layout ({shape['layout']}) is neither BSHD nor BHSD")


def input_sets_that_fit(torch, shape, elem_bytes):
    wanted = max(1, int(shape.get("input_sets", 1)))
    b, d = shape["b"], shape["d"]
    q_and_o = 2 * b * shape["sq"] * shape["hq"] * d
    k_and_v = 2 * b * shape["sk"] * shape["hkv"] * d
    set_bytes = (q_and_o + k_and_v) * elem_bytes
    free_bytes, _ = torch.cuda.mem_get_info()
    fits = max(1, int(free_bytes * INPUT_SET_MEMORY_SHARE) // set_bytes)
    if fits < wanted:
        print(f"note: {shape['name']}: {wanted} input sets of {set_bytes / 2**30:.2f} GiB do not "
              f"fit; using {fits}", flush=True)
    return min(wanted, fits)


def refuse_shape(shape, message):
    entries = [error_entry(f"{peer}/{shape['name']}", message) for peer, _ in PEERS]
    for entry in entries:
        print_entry(entry)
    return entries


def measure_shape(torch, shape):
    """One entry per peer for this shape, successful or not; never raises for a refused shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    names = [f"{peer}/{shape['name']}" for peer, _ in PEERS]

    # PyTorch's is_causal masks top-left aligned; this project's mask is bottom-right aligned. The two
    # agree only when Sq == Sk, so anything else would be timing a different computation.
    if shape["causal"] and shape["sq"] != shape["sk"]:
        return refuse_shape(shape, "causal with Sq != Sk: PyTorch's mask is top-left aligned")

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    if shape["dtype"] not in dtypes:
        return refuse_shape(shape, f"dtype ({shape['dtype']}) is neither fp16 nor bf16")
    dtype = dtypes[shape["dtype"]]

    try:
        num_sets = input_sets_that_fit(torch, shape, torch.finfo(dtype).bits // 8)
        # O is not among the sets: the functional API allocates it, and the caching allocator
        # hands back the same block every launch.
        input_sets = [(make_tensor(torch, shape, shape["sq"], shape["hq"], dtype),
                       make_tensor(torch, shape, shape["sk"], shape["hkv"], dtype),
                       make_tensor(torch, shape, shape["sk"], shape["hkv"], dtype))
                      for _ in range(num_sets)]
    except Exception as exc:
        return refuse_shape(shape, "could not build inputs: " + describe_failure(exc, []))

    entries = []
    for (peer, backend_name), name in zip(PEERS, names):
        backend = getattr(SDPBackend, backend_name)

        def launch(i):
            q, k, v = input_sets[i]
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=shape["causal"], scale=shape["scale"],
                enable_gqa=shape["hq"] != shape["hkv"])

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                # The backend is chosen when SDPA is called, so it must be pinned around the
                # warm-up, the graph capture and the eager launches alike.
                with sdpa_kernel(backend):
                    time_us, samples, n = time_launches(torch, launch, num_sets, shape["graph"])
                entry = ok_entry(name, time_us, samples, n, flops=shape["flops"],
                                 num_bytes=shape["bytes"], input_sets=num_sets)
            except Exception as exc:
                entry = error_entry(name, describe_failure(exc, caught))
        free_cuda_memory(torch)
        print_entry(entry)
        entries.append(entry)
    return entries


# ----------------------------------------------------------------------------------------------
# Context and output
# ----------------------------------------------------------------------------------------------

def driver_version():
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True)
        lines = result.stdout.strip().splitlines()
        return lines[0].strip() if lines else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def checkout_commit():
    """The repository's commit, as the C++ build records it: short hash, "-dirty" when tracked
    files differ from it, "unknown" outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short=7", "HEAD"], capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        changes = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        return commit + ("-dirty" if changes else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_context(torch, args, suite):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": "tools/peers.py",
        "gpu": torch.cuda.get_device_name(),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": str(torch.backends.cudnn.version()),
        "commit": args.commit or os.environ.get("ATTN_COMMIT") or checkout_commit(),
        "sm_count": props.multi_processor_count,
        # Older PyTorch builds lack the property; the runner's figure is for the same device.
        "l2_bytes": getattr(props, "L2_cache_size", None) or suite.get("l2_bytes"),
    }


def write_results(path, context, entries):
    """Written after every shape, so that a run killed half-way (a sticky CUDA error, a lost
    machine) still leaves everything measured so far."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump({"context": context, "benchmarks": entries}, f, indent=2)
        f.write("\n")
    os.replace(temporary, path)


def main(argv=None):
    args = parse_args(argv)

    with open(args.shapes) as f:
        suite = json.load(f)
    shapes = suite["shapes"]
    if args.only:
        shapes = [s for s in shapes if args.only in s["name"]]
        if not shapes:
            sys.exit(f"peers.py: no shape name contains '{args.only}'")

    # Imported here so that --help, and a mistyped argument, work on machines without PyTorch.
    try:
        import torch
    except ImportError:
        sys.exit(f"peers.py: PyTorch is missing for {sys.executable}: install the build for your CUDA "
                 "version, e.g.\n"
                 f"    {os.path.basename(sys.executable)} -m pip install -r tools/requirements-peers.txt "
                 "--index-url https://download.pytorch.org/whl/cu130\n"
                 "(https://pytorch.org/get-started/locally/ lists the others)")

    if not torch.cuda.is_available():
        sys.exit("peers.py: PyTorch sees no CUDA device")
    torch.manual_seed(0)

    context = build_context(torch, args, suite)
    print(f"{context['gpu']}, driver {context['driver']}, CUDA {context['cuda']}, "
          f"PyTorch {context['torch']}, cuDNN {context['cudnn']}", flush=True)
    print_header()

    entries = measure_ceilings(torch)
    write_results(args.out, context, entries)
    for shape in shapes:
        entries.extend(measure_shape(torch, shape))
        if shape["kind"] == "decode":
            entries.append(copy_of_shape(torch, shape))
        free_cuda_memory(torch)  # the shape's input sets died with measure_shape()
        write_results(args.out, context, entries)

    failed = sum(1 for e in entries if e.get("error_occurred"))
    print(f"wrote {args.out}: {len(entries) - failed} measured, {failed} refused or failed",
          flush=True)


if __name__ == "__main__":
    main()
