#!/usr/bin/env python3
"""Draw docs/progression.png and regenerate the README's results table from one GPU's results.

Reads, from --results (results/h100 by default):
  bench.json   the stages, from the C++ bench: `<stage>/<shape>`, context key `stage.<stage>` = idea
  peers.json   PyTorch's SDPA backends and the two ceilings, from tools/peers.py
Both are Google Benchmark JSON (README, "Benchmark and regenerate the chart"). Either may lack stages, shapes
or the whole file: what is missing is left out of the figure and written as "—" in the table,
never guessed. The list of stages is whatever bench.json holds, so a new stage needs no edit here.

    python3 tools/plot.py --results results/h100 --png docs/progression.png --readme README.md

Needs matplotlib (tools/requirements.txt; Debian's python3-matplotlib is enough) and the
standard library.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(f"plot.py: matplotlib is missing for {sys.executable}: install it with\n"
             f"    {os.path.basename(sys.executable)} -m pip install -r tools/requirements.txt\n"
             "(or, for Debian's system python3: apt-get install python3-matplotlib)")

matplotlib.use("Agg")  # CI has no display; must precede the pyplot import
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

BEGIN_MARKER = "<!-- BEGIN RESULTS TABLE -->"
END_MARKER = "<!-- END RESULTS TABLE -->"
MISSING = "—"

# The peers are fixed, unlike the stages. name, legend label, README idea, line style.
PEERS = (
    ("sdpa_flash", "FA2 (sdpa_flash)", "FlashAttention-2, through PyTorch SDPA",
     {"color": "black", "marker": "s"}),
    ("sdpa_efficient", "sdpa_efficient",
     "memory-efficient attention (xFormers), through PyTorch SDPA",
     {"color": "0.62", "marker": "D"}),
    ("sdpa_cudnn", "cuDNN (sdpa_cudnn)", "cuDNN fused attention, through PyTorch SDPA",
     {"color": "0.38", "marker": "^"}),
)
FA2 = "sdpa_flash"

PREFILL_NAME = re.compile(r"^prefill_d(\d+)_s(\d+)(_causal)?$")
DECODE_NAME = re.compile(r"^decode_b(\d+)_sk(\d+)$")
SWEEP_NAME = re.compile(r"^sweep_bh(\d+)$")

TO_MICROSECONDS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

def canonical_name(name):
    """`<series>/<shape>` without the suffixes Google Benchmark may append (`/manual_time`,
    `/iterations:10`, `/repeats:3`, ...), so options chosen in the C++ bench do not rename rows."""
    parts = name.split("/")
    while len(parts) > 2 and (":" in parts[-1] or parts[-1] in ("manual_time", "real_time")):
        parts.pop()
    return "/".join(parts)


def as_number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def load_results(path):
    """(context, {name: {"us", "TFLOPs", "GBps"}}) from one Google Benchmark JSON file.

    Failed runs and aggregates (mean, stddev, ...) are dropped: an error's zero time or a standard
    deviation must never be plotted as a measurement. Repeated runs of one name keep the median.
    """
    if not os.path.exists(path):
        print(f"plot.py: warning: {path} not found; its entries are shown as {MISSING}",
              file=sys.stderr)
        return {}, {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)

    runs = {}
    for bench in data.get("benchmarks", []):
        if bench.get("error_occurred") or bench.get("run_type") == "aggregate":
            continue
        name = canonical_name(bench.get("name", ""))
        if "/" not in name:
            continue
        time_us = as_number(bench.get("real_time"))
        unit = TO_MICROSECONDS.get(bench.get("time_unit", "ns"))
        runs.setdefault(name, []).append({
            "us": time_us * unit if time_us is not None and unit is not None else None,
            "TFLOPs": as_number(bench.get("TFLOPs")),
            "GBps": as_number(bench.get("GBps")),
        })

    entries = {}
    for name, repeats in runs.items():
        entry = {}
        for key in ("us", "TFLOPs", "GBps"):
            values = [r[key] for r in repeats if r[key] is not None]
            entry[key] = statistics.median(values) if values else None
        entries[name] = entry
    return data.get("context", {}), entries


class Results:
    """The stages' and the peers' entries side by side, looked up by series and shape."""

    def __init__(self, results_dir):
        self.bench_context, bench = load_results(os.path.join(results_dir, "bench.json"))
        self.peers_context, peers = load_results(os.path.join(results_dir, "peers.json"))
        # Every prefix in bench.json is a stage (zero-padded numbers make the sort the series
        # order), unless it is a peer's or a ceiling's name that strayed in.
        not_stages = {"ceiling"} | {name for name, _, _, _ in PEERS}
        self.stages = sorted({name.split("/", 1)[0] for name in bench} - not_stages)
        self.entries = {**peers, **bench}
        self.directory = os.path.normpath(results_dir).replace(os.sep, "/")

    def get(self, series, shape, key):
        return self.entries.get(f"{series}/{shape}", {}).get(key)

    def shapes(self):
        return {name.split("/", 1)[1] for name in self.entries}

    def context(self, key):
        """A context value, preferring the stages' run; None if neither file records it."""
        for context in (self.bench_context, self.peers_context):
            value = context.get(key)
            if value not in (None, ""):
                return str(value)
        return None

    def description(self, stage):
        return self.bench_context.get(f"stage.{stage}")

    def ceiling_matmul(self):
        return self.get("ceiling", "matmul_bf16", "TFLOPs")

    def ceiling_copy(self):
        return self.get("ceiling", "copy", "GBps")


def short_sha(commit):
    if not commit:
        return "unknown"
    return commit[:7] if re.fullmatch(r"[0-9a-fA-F]{8,40}", commit) else commit


# ----------------------------------------------------------------------------------------------
# Figure
# ----------------------------------------------------------------------------------------------

class Series:
    def __init__(self, name, label, style):
        self.name, self.label, self.style = name, label, style


def stage_series(results):
    """One colour per stage, stable for a given list of stages."""
    count = len(results.stages)
    if count <= 10:
        colours = [matplotlib.colormaps["tab10"](i) for i in range(count)]
    else:
        colours = [matplotlib.colormaps["viridis"](i / (count - 1)) for i in range(count)]
    return [Series(stage, stage, {"color": colour, "marker": "o"})
            for stage, colour in zip(results.stages, colours)]


def peer_series(names=None):
    return [Series(name, label, style) for name, label, _, style in PEERS
            if names is None or name in names]


def kilo(value):
    return f"{value // 1024}k" if value >= 1024 and value % 1024 == 0 else str(value)


def prefill_name(head_dim, seq_len, causal):
    return f"prefill_d{head_dim}_s{seq_len}" + ("_causal" if causal else "")


def no_data(ax, what):
    ax.text(0.5, 0.5, f"no {what} in the results", transform=ax.transAxes,
            ha="center", va="center", color="0.4")


def plain_log_axis(axis, low=None, high=None):
    """Label a log axis 1, 2, 5, 10, 20, ... instead of 10^1: easier to read values off."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if low is not None:
        decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        ticks = [m * 10.0 ** e for e in decades for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
        if len(ticks) >= 2:  # otherwise matplotlib's own choice says more
            axis.set_major_locator(FixedLocator(ticks))
            axis.set_minor_formatter(NullFormatter())


def ceiling_line(ax, value, text):
    """A dotted horizontal line labelled at its right end, so it reads without a legend."""
    ax.axhline(value, color="tab:red", linestyle=":", linewidth=1.2)
    ax.text(0.99, value, text, transform=blended_transform_factory(ax.transAxes, ax.transData),
            ha="right", va="bottom", fontsize=8, color="tab:red")


def plot_prefill(ax, results, series, head_dim):
    lengths = sorted({int(m.group(2)) for m in map(PREFILL_NAME.match, results.shapes())
                      if m and int(m.group(1)) == head_dim})
    ax.set_title(f"({'a' if head_dim == 128 else 'b'}) prefill, D={head_dim}: TFLOP/s vs S "
                 f"(B·S = 16k)", fontsize=10)
    if not lengths:
        no_data(ax, f"prefill D={head_dim} shapes")
        return

    rates = []
    for s in series:
        for causal in (False, True):
            points = [(n, results.get(s.name, prefill_name(head_dim, n, causal), "TFLOPs"))
                      for n in lengths]
            points = [(n, v) for n, v in points if v is not None]
            if not points:
                continue
            ax.plot([n for n, _ in points], [v for _, v in points],
                    linestyle="--" if causal else "-", markersize=4, linewidth=1.5, **s.style)
            rates += [v for _, v in points]
    if not rates:
        no_data(ax, f"prefill D={head_dim} figures")
        return
    ceiling = results.ceiling_matmul()
    if ceiling:
        ceiling_line(ax, ceiling, f"bf16 matmul {ceiling:.0f} TFLOP/s")

    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([kilo(n) for n in lengths])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_ylim(top=max(rates + [ceiling or 0]) * 1.6)  # room for the ceiling's label
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("sequence length S (= Sq = Sk)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)


def plot_seed(ax, results, series):
    ax.set_title("(c) seed (B=1, H=1, S=128, D=64): latency, µs", fontsize=10)
    values = [results.get(s.name, "seed", "us") for s in series]
    present = [v for v in values if v is not None]
    if not present:
        no_data(ax, "seed figures")
        return

    positions = range(len(series))
    low, high = min(present) / 2, max(present) * 4  # room on the right for the value labels
    for y, s, value in zip(positions, series, values):
        if value is None:
            ax.text(low * 1.1, y, MISSING, va="center", fontsize=8)
            continue
        # On a log axis a bar cannot start at 0; start them all at the axis' left edge.
        ax.barh(y, value - low, left=low, color=s.style["color"], height=0.7)
        ax.text(value * 1.08, y, f"{format_number(value)} µs", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    plain_log_axis(ax.xaxis, low, high)
    ax.set_yticks(list(positions))
    ax.set_yticklabels([s.label for s in series], fontsize=8)
    ax.invert_yaxis()  # first stage on top, reading down like the README table
    ax.set_xlabel("µs per launch (CUDA graph)")
    ax.grid(True, axis="x", which="major", alpha=0.3)


def plot_decode(ax, results, series):
    ax.set_title("(d) decode (Hq=32, Hkv=8, D=128): GB/s", fontsize=10)
    shapes = sorted((int(m.group(1)), int(m.group(2)), m.group(0))
                    for m in map(DECODE_NAME.match, results.shapes()) if m)
    series = [s for s in series if any(results.get(s.name, name, "GBps") for _, _, name in shapes)]
    if not shapes or not series:
        no_data(ax, "decode figures")
        return

    width = 0.8 / len(series)
    for i, s in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        for x, (_, _, name) in enumerate(shapes):
            value = results.get(s.name, name, "GBps")
            if value is None:
                # A gap alone would read as "very slow"; mark it as "not measured".
                ax.text(x + offset, 0, MISSING, ha="center", va="bottom", fontsize=7,
                        color=s.style["color"])
            else:
                ax.bar(x + offset, value, width, color=s.style["color"])
    ceiling = results.ceiling_copy()
    if ceiling:
        ceiling_line(ax, ceiling, f"copy {ceiling:.0f} GB/s")
        # Small decode shapes fit in L2 and may beat the copy from HBM: never clip a bar.
        tallest = max(results.get(s.name, name, "GBps") or 0
                      for s in series for _, _, name in shapes)
        ax.set_ylim(0, max(ceiling, tallest) * 1.12)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"B={b}\nSk={kilo(sk)}" for b, sk, _ in shapes], fontsize=8)
    ax.set_ylabel("GB/s (Q, K, V read + O written)")
    ax.grid(True, axis="y", alpha=0.3)


def plot_sweep(ax, results, series):
    ax.set_title("(e) parallelism sweep: time vs B·H", fontsize=10)
    sizes = sorted(int(m.group(1)) for m in map(SWEEP_NAME.match, results.shapes()) if m)
    times = []
    for s in series:
        points = [(n, results.get(s.name, f"sweep_bh{n}", "us")) for n in sizes]
        points = [(n, v) for n, v in points if v is not None]
        if points:
            ax.plot([n for n, _ in points], [v for _, v in points], markersize=4, linewidth=1.5,
                    **s.style)
            times += [v for _, v in points]
    if not times:
        no_data(ax, "sweep figures")
        return
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis, min(times) / 1.2, max(times) * 1.2)
    ax.set_xlabel("B·H (independent heads)")
    ax.set_ylabel("µs per launch")
    ax.grid(True, which="major", alpha=0.3)


def add_legend(fig, series):
    """One legend for every panel, below them: a series has the same colour and marker everywhere,
    and a legend inside a panel would hide the very lines it explains."""
    handles = [Line2D([], [], linestyle="-", markersize=5, **s.style) for s in series]
    labels = [s.label for s in series]
    handles += [Line2D([], [], color="0.3", linestyle="-"),
                Line2D([], [], color="0.3", linestyle="--"),
                Line2D([], [], color="tab:red", linestyle=":")]
    labels += ["non-causal", "causal", "ceiling (same run)"]
    columns = len(labels) if len(labels) <= 8 else math.ceil(len(labels) / 2)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=9, frameon=False)


def has_sweep(results):
    return any(SWEEP_NAME.match(name.split("/", 1)[1])
               for name in results.entries if name.split("/", 1)[0] in results.stages)


def draw_figure(results, png_path):
    stages = stage_series(results)
    sweep = has_sweep(results)
    fig, axes = plt.subplots(2, 3 if sweep else 2, figsize=(14, 10))
    panels = list(axes.flat)

    plot_prefill(panels[0], results, stages + peer_series({"sdpa_flash", "sdpa_cudnn"}), 128)
    plot_prefill(panels[1], results, stages + peer_series({"sdpa_flash", "sdpa_cudnn"}), 64)
    if sweep:
        # 2x3: (a) (b) (c) on top, (d) (e) below; the sixth cell stays empty.
        plot_seed(panels[2], results, stages + peer_series())
        plot_decode(panels[3], results, stages + peer_series())
        plot_sweep(panels[4], results, stages + peer_series())
        panels[5].axis("off")
    else:
        plot_seed(panels[2], results, stages + peer_series())
        plot_decode(panels[3], results, stages + peer_series())

    add_legend(fig, stages + peer_series())
    gpu = results.context("gpu") or "unknown GPU"
    commit = short_sha(results.context("commit"))
    fig.suptitle(f"Attention progression on {gpu} — commit {commit}", fontsize=13)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    directory = os.path.dirname(png_path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# README table
# ----------------------------------------------------------------------------------------------

def format_number(value):
    """Three significant figures or so, without the exponent notation `%g` falls into."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_percent(fraction):
    percent = 100 * fraction
    return f"{percent:.0f}%" if percent >= 9.95 else f"{percent:.1f}%"


def rate_cell(value, ceiling):
    if value is None:
        return MISSING
    if not ceiling:
        return format_number(value)
    return f"{format_number(value)} ({format_percent(value / ceiling)})"


def seed_cell(time_us, fa2_time_us):
    if time_us is None:
        return MISSING
    if not fa2_time_us:
        return format_number(time_us)
    # FA2's time over ours: above 1 means faster than FlashAttention-2.
    return f"{format_number(time_us)} ({fa2_time_us / time_us:.2f}× FA2)"


def markdown_text(text):
    return " ".join(text.split()).replace("|", "\\|")


def table_rows(results):
    """(series, idea) for each stage, then each peer."""
    rows = [(stage, results.description(stage)) for stage in results.stages]
    rows += [(name, idea) for name, _, idea, _ in PEERS]
    return rows


def build_table(results):
    matmul, copy = results.ceiling_matmul(), results.ceiling_copy()
    fa2_seed = results.get(FA2, "seed", "us")
    lines = [
        "| stage | idea | seed (µs) | prefill d128 s4096 (TFLOP/s) | same, causal "
        "| decode b1 sk131072 (GB/s) | decode b8 sk32768 (GB/s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for series, idea in table_rows(results):
        cells = [
            f"`{series}`",
            markdown_text(idea) if idea else MISSING,
            seed_cell(results.get(series, "seed", "us"), fa2_seed),
            rate_cell(results.get(series, "prefill_d128_s4096", "TFLOPs"), matmul),
            rate_cell(results.get(series, "prefill_d128_s4096_causal", "TFLOPs"), matmul),
            rate_cell(results.get(series, "decode_b1_sk131072", "GBps"), copy),
            rate_cell(results.get(series, "decode_b8_sk32768", "GBps"), copy),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_footer(results):
    def known(value):
        return value if value else "unknown"

    commit = known(results.bench_context.get("commit") or results.context("commit"))
    peers_commit = results.peers_context.get("commit")
    if peers_commit and peers_commit != "unknown" and peers_commit != commit:
        commit += f" (peers: {peers_commit})"
    # Keep the day only: the time of day adds nothing and would churn the README on reruns.
    date = known(results.context("date"))[:10]
    matmul, copy = results.ceiling_matmul(), results.ceiling_copy()
    copy_text = f"{copy / 1000:.2f}" if copy else MISSING
    matmul_text = f"{matmul:.0f}" if matmul else MISSING
    gpu, driver, cuda = (known(results.context(key)) for key in ("gpu", "driver", "cuda"))
    torch = known(results.peers_context.get("torch"))
    return (f"Measured on {gpu}, driver {driver}, CUDA {cuda}, PyTorch {torch}, "
            f"commit {commit}, {date}; ceilings: copy {copy_text} TB/s, bf16 matmul {matmul_text} "
            f"TFLOP/s (same run). In parentheses: the share of that ceiling; for seed, FA2's time "
            f"divided by this one.")


def build_block(results, png_path, readme_path):
    image = os.path.relpath(png_path, os.path.dirname(os.path.abspath(readme_path)) or ".")
    image = image.replace(os.sep, "/")
    return f"{build_table(results)}\n\n{build_footer(results)}\n\n![progression]({image})\n"


def replace_between_markers(text, block, where="README", begin_marker=BEGIN_MARKER,
                            end_marker=END_MARKER):
    begin = text.find(begin_marker)
    if begin < 0:
        raise ValueError(f"{where}: the line '{begin_marker}' is missing; add it, and "
                         f"'{end_marker}' after it, where the results table belongs")
    end = text.find(end_marker, begin)
    if end < 0:
        raise ValueError(f"{where}: '{end_marker}' is missing after '{begin_marker}'")
    # Blank lines around the block: Markdown needs them for the table after an HTML comment.
    return text[:begin + len(begin_marker)] + "\n\n" + block + "\n" + text[end:]


def update_readme(readme_path, block):
    with open(readme_path, encoding="utf-8", newline="") as f:
        text = f.read()
    updated = replace_between_markers(text, block, where=readme_path)
    if updated != text:
        with open(readme_path, "w", encoding="utf-8", newline="") as f:
            f.write(updated)


# ----------------------------------------------------------------------------------------------
# Notebook tables: one per stage, between the markers below in notebooks_md/NN_name.md
# ----------------------------------------------------------------------------------------------

STAGE_BEGIN_MARKER = "<!-- BEGIN STAGE TABLE -->"
STAGE_END_MARKER = "<!-- END STAGE TABLE -->"
CUDNN = "sdpa_cudnn"

# The shapes of a stage's table: (shape, key, unit). Times are compared as speed (previous time
# over this one), rates as this rate over the previous one: above 1 means this stage is faster.
STAGE_TABLE_SHAPES = (
    ("seed", "us", "µs"),
    ("sweep_bh16", "us", "µs"),
    ("sweep_bh64", "us", "µs"),
    ("sweep_bh256", "us", "µs"),
    ("decode_b1_sk4096", "GBps", "GB/s"),
    ("decode_b1_sk131072", "GBps", "GB/s"),
    ("decode_b8_sk32768", "GBps", "GB/s"),
    ("prefill_d128_s512", "TFLOPs", "TFLOP/s"),
    ("prefill_d128_s4096", "TFLOPs", "TFLOP/s"),
    ("prefill_d128_s4096_causal", "TFLOPs", "TFLOP/s"),
    ("prefill_d128_s16384", "TFLOPs", "TFLOP/s"),
    ("prefill_d64_s512", "TFLOPs", "TFLOP/s"),
    ("prefill_d64_s4096", "TFLOPs", "TFLOP/s"),
    ("prefill_d64_s4096_causal", "TFLOPs", "TFLOP/s"),
)


def speedup(results, faster, slower, shape, key):
    """How many times faster series `faster` is than `slower` on a shape, or None."""
    a, b = results.get(faster, shape, key), results.get(slower, shape, key)
    if a is None or b is None:
        return None
    return b / a if key == "us" else a / b


def ratio_cell(value):
    if value is None:
        return MISSING
    return f"{value:.2f}×" if value >= 0.1 else f"{value:.3f}×"


def build_stage_table(results, stage):
    """The notebook table of one stage: its figures, the previous stage's, FA2's and cuDNN's, and
    the ratios of the same run. Missing entries read as a dash, never a guess."""
    index = results.stages.index(stage)
    previous = results.stages[index - 1] if index > 0 else None
    header = ["shape", "unit"]
    if previous:
        header.append(f"`{previous}`")
    header += [f"`{stage}`"]
    if previous:
        header.append(f"{stage[:2]} vs {previous[:2]}")
    header += ["FA2", f"{stage[:2]} vs FA2", "cuDNN", f"{stage[:2]} vs cuDNN"]
    lines = ["| " + " | ".join(header) + " |",
             "| --- | --- |" + " ---: |" * (len(header) - 2)]
    for shape, key, unit in STAGE_TABLE_SHAPES:
        def value(series):
            v = results.get(series, shape, key)
            return MISSING if v is None else format_number(v)
        cells = [f"`{shape}`", unit]
        if previous:
            cells.append(value(previous))
        cells.append(value(stage))
        if previous:
            cells.append(ratio_cell(speedup(results, stage, previous, shape, key)))
        cells += [value(FA2), ratio_cell(speedup(results, stage, FA2, shape, key)),
                  value(CUDNN), ratio_cell(speedup(results, stage, CUDNN, shape, key))]
        lines.append("| " + " | ".join(cells) + " |")
    gpu = results.context("gpu") or "unknown GPU"
    lines.append("")
    # The commit measured is in the JSON's context and under the README's table; a notebook
    # carries no commit hashes.
    lines.append(f"One run on {gpu} (`{results.directory}/bench.json` and "
                 f"`peers.json`), stages and peers together; FA2 is `sdpa_flash`, cuDNN "
                 f"`sdpa_cudnn`. A ratio above 1× means faster; {MISSING}: not measured.")
    return "\n".join(lines) + "\n"


DECODE_BEGIN_MARKER = "<!-- BEGIN DECODE TABLE -->"
DECODE_END_MARKER = "<!-- END DECODE TABLE -->"


def build_decode_table(results, stage):
    """A notebook's decode table: the stage on each decode shape against the copy ceiling and
    against a copy of the shape's own bytes (`copy/<shape>` in peers.json), which a launch that
    short cannot amortise its ramp and tail in. Missing entries read as a dash."""
    copy = results.ceiling_copy()
    shapes = sorted((m.group(0) for m in map(DECODE_NAME.match, results.shapes()) if m),
                    key=lambda name: tuple(int(x) for x in DECODE_NAME.match(name).groups()))
    lines = [f"| shape | `{stage}` (µs) | GB/s | share of the copy ceiling | a copy of the same "
             f"bytes (µs) | its share of the ceiling | `{stage[:2]}` vs that copy |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for shape in shapes:
        def cell(value, fmt=format_number):
            return MISSING if value is None else fmt(value)
        rate, same = results.get(stage, shape, "GBps"), results.get("copy", shape, "GBps")
        share = lambda r: None if r is None or not copy else r / copy
        lines.append("| " + " | ".join([
            f"`{shape}`", cell(results.get(stage, shape, "us")), cell(rate),
            cell(share(rate), lambda v: f"{v:.2f}"), cell(results.get("copy", shape, "us")),
            cell(share(same), lambda v: f"{v:.2f}"),
            ratio_cell(speedup(results, stage, "copy", shape, "us"))]) + " |")
    lines.append("")
    lines.append(f"The same run as the stage table; the ceiling is the 1 GiB copy "
                 f"({format_number(copy) if copy else MISSING} GB/s). A ratio above 1× means "
                 f"faster than the copy of the same bytes.")
    return "\n".join(lines) + "\n"


def update_notebooks(notebooks_dir, results):
    """Rewrite the stage table of every notebook NN_name.md whose stage is in the results."""
    updated = []
    for name in sorted(os.listdir(notebooks_dir)):
        stage, extension = os.path.splitext(name)
        if extension != ".md" or stage not in results.stages:
            continue
        path = os.path.join(notebooks_dir, name)
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        if STAGE_BEGIN_MARKER not in text:
            continue
        new_text = replace_between_markers(text, build_stage_table(results, stage), path,
                                           STAGE_BEGIN_MARKER, STAGE_END_MARKER)
        if DECODE_BEGIN_MARKER in new_text:
            new_text = replace_between_markers(new_text, build_decode_table(results, stage),
                                               path, DECODE_BEGIN_MARKER, DECODE_END_MARKER)
        if new_text != text:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(new_text)
        updated.append(path)
    return updated


# ----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Draw the progression chart and rewrite the README results table.")
    parser.add_argument("--results", default="results/h100",
                        help="folder with bench.json and peers.json (default: results/h100)")
    parser.add_argument("--png", default="docs/progression.png",
                        help="figure to write (default: docs/progression.png)")
    parser.add_argument("--readme", default="README.md",
                        help="README whose results table is rewritten (default: README.md)")
    parser.add_argument("--notebooks", metavar="DIR",
                        help="instead of the README and the figure, rewrite the stage table of "
                             "every notebook DIR/NN_name.md (between its STAGE TABLE markers, "
                             "and its DECODE TABLE markers where it has them)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    results = Results(args.results)
    if not results.stages:
        print(f"plot.py: warning: no stage results in {args.results}/bench.json", file=sys.stderr)
    gpus = {c.get("gpu") for c in (results.bench_context, results.peers_context) if c.get("gpu")}
    if len(gpus) > 1:
        print(f"plot.py: warning: bench.json and peers.json come from different GPUs: "
              f"{', '.join(sorted(gpus))}", file=sys.stderr)

    if args.notebooks:
        try:
            for path in update_notebooks(args.notebooks, results):
                print(f"wrote the stage table in {path}", file=sys.stderr)
        except (OSError, ValueError) as exc:
            sys.exit(f"plot.py: {exc}")
        return

    block = build_block(results, args.png, args.readme)
    try:
        update_readme(args.readme, block)
    except (OSError, ValueError) as exc:
        sys.exit(f"plot.py: {exc}")
    draw_figure(results, args.png)
    print(block, end="")
    print(f"wrote {args.png} and the table in {args.readme}", file=sys.stderr)


if __name__ == "__main__":
    main()
