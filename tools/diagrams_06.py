#!/usr/bin/env python3
"""Pictures of notebooks_md/06_warp_specialized.md, drawn from the kernel's constants (not measured):
  docs/img/06_ring.png      the K/V ring: each slot's full and empty barriers, phase by phase
  docs/img/06_timeline.png  producer and consumer warpgroups over two tiles, and the tensor cores
  docs/img/06_layout.png    where a thread's wgmma accumulators sit in a 64 x N tile

Usage: python3 tools/diagrams_06.py [--out docs/img]   (needs matplotlib)
"""
import argparse
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
except ImportError:
    sys.exit("tools/diagrams_06.py needs matplotlib: pip install -r tools/requirements.txt")


def ring(path, stages=2, uses=6):
    """Slot s of the ring holds tile t = s, s + stages, ...; use n of a slot has phase parity n % 2."""
    fig, ax = plt.subplots(figsize=(10, 2.8))
    for t in range(uses):
        slot, use = t % stages, t // stages
        x = t * 1.6
        y = (stages - 1 - slot) * 1.1
        ax.add_patch(Rectangle((x, y), 1.4, 0.9, facecolor="#cfe3f7" if use % 2 == 0 else "#f7dccf",
                               edgecolor="black"))
        ax.text(x + 0.7, y + 0.62, f"tile {t}", ha="center", fontsize=9)
        ax.text(x + 0.7, y + 0.35, f"full: wait parity {use % 2}", ha="center", fontsize=7)
        ax.text(x + 0.7, y + 0.12, f"empty: wait parity {(use % 2) ^ 1}", ha="center", fontsize=7)
    for s in range(stages):
        ax.text(-0.2, (stages - 1 - s) * 1.1 + 0.45, f"slot {s}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-1.2, uses * 1.6)
    ax.set_ylim(-0.2, stages * 1.1)
    ax.axis("off")
    ax.set_title("K/V ring: tile t uses slot t % stages; a slot's n-th use waits for phase parity n % 2 "
                 "(consumers, full) and n % 2 ^ 1 (producer, empty; a fresh barrier passes parity 1)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def timeline(path):
    """Two consumer warpgroups released by the same barrier: their softmax runs at the same time."""
    fig, ax = plt.subplots(figsize=(10, 3.2))
    lanes = ["producer", "consumer WG 1", "consumer WG 2", "tensor cores"]
    colors = {"TMA": "#bbbbbb", "S=QK^T": "#4c72b0", "softmax": "#dd8452", "O+=PV": "#55a868",
              "idle": "#ffffff"}
    blocks = {
        0: [(0, 1.0, "TMA"), (1.0, 1.0, "TMA"), (3.2, 1.0, "TMA"), (6.4, 1.0, "TMA")],
        1: [(1.0, 1.0, "S=QK^T"), (2.0, 1.2, "softmax"), (3.2, 1.0, "O+=PV"), (4.2, 1.0, "S=QK^T"),
            (5.2, 1.2, "softmax"), (6.4, 1.0, "O+=PV")],
        2: [(1.0, 1.0, "S=QK^T"), (2.0, 1.2, "softmax"), (3.2, 1.0, "O+=PV"), (4.2, 1.0, "S=QK^T"),
            (5.2, 1.2, "softmax"), (6.4, 1.0, "O+=PV")],
        3: [(1.0, 1.0, "S=QK^T"), (2.0, 1.2, "idle"), (3.2, 1.0, "O+=PV"), (4.2, 1.0, "S=QK^T"),
            (5.2, 1.2, "idle"), (6.4, 1.0, "O+=PV")],
    }
    for lane, items in blocks.items():
        y = len(lanes) - 1 - lane
        for x, w, kind in items:
            ax.add_patch(Rectangle((x, y + 0.1), w, 0.8, facecolor=colors[kind], edgecolor="black",
                                   hatch="//" if kind == "idle" else None))
            ax.text(x + w / 2, y + 0.5, kind if kind != "TMA" else "copy K,V", ha="center", va="center",
                    fontsize=7)
    for i, name in enumerate(lanes):
        ax.text(-0.1, len(lanes) - 1 - i + 0.5, name, ha="right", va="center", fontsize=9)
    ax.text(3.8, -0.35, "both warpgroups wait on the same full barrier, so their softmaxes coincide and "
            "the tensor cores idle (hatched); stage 07 staggers them", ha="center", fontsize=8)
    ax.set_xlim(-1.8, 7.6)
    ax.set_ylim(-0.6, len(lanes))
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def layout(path, n=32):
    """Accumulator d[4j + e] of thread t: row 16 (t / 32) + (t % 32) / 4 + 8 ((e >> 1) & 1),
    column 8 j + 2 (t % 4) + (e & 1)."""
    fig, ax = plt.subplots(figsize=(8, 8.5))
    warp_colors = ["#cfe3f7", "#f7dccf", "#d5efd0", "#eadcf5"]
    for t in range(128):
        for j in range(n // 8):
            for e in range(4):
                r = 16 * (t // 32) + (t % 32) // 4 + 8 * ((e >> 1) & 1)
                c = 8 * j + 2 * (t % 4) + (e & 1)
                ax.add_patch(Rectangle((c, 63 - r), 1, 1, facecolor=warp_colors[t // 32], edgecolor="#999999",
                                       linewidth=0.2))
                if t % 32 < 8 and j < 2 and t // 32 == 0:
                    ax.text(c + 0.5, 63 - r + 0.5, f"{t}\n{4 * j + e}", ha="center", va="center", fontsize=4.5)
    ax.set_xlim(0, n)
    ax.set_ylim(0, 64)
    ax.set_aspect("equal")
    ax.set_xlabel("column (key of S, or head dimension of O)")
    ax.set_ylabel("row (63 at the bottom)")
    ax.set_title("wgmma m64nN accumulators: warp w of the warpgroup owns rows 16w..16w+15 (colours);\n"
                 "labels: thread, register index (first 8 threads, first 16 columns)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ring(os.path.join(args.out, "06_ring.png"))
    timeline(os.path.join(args.out, "06_timeline.png"))
    layout(os.path.join(args.out, "06_layout.png"))


if __name__ == "__main__":
    main()
