#!/usr/bin/env python3
"""Pictures of notebooks_md/07_overlap.md: schematic timelines (not measured) of the three overlaps.
  docs/img/07_pingpong.png  two consumer warpgroups taking turns on the tensor cores
  docs/img/07_intra.png     one warpgroup: S of tile t issued with P.V of tile t - 1
  docs/img/07_pdl.png       two launches in a stream, without and with programmatic dependent launch

Usage: python3 tools/diagrams_07.py [--out docs/img]   (needs matplotlib)
"""
import argparse
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
except ImportError:
    sys.exit("tools/diagrams_07.py needs matplotlib: pip install -r tools/requirements.txt")

COLORS = {"S": "#4c72b0", "PV": "#55a868", "softmax": "#dd8452", "wait": "#eeeeee",
          "prologue": "#8172b2", "work": "#4c72b0", "drain": "#937860", "launch": "#bbbbbb"}
LABELS = {"S": "S = Q.K^T", "PV": "O += P.V", "softmax": "softmax", "wait": "waiting",
          "prologue": "prologue (barriers, tensor maps)", "work": "loads and products",
          "drain": "last CTAs finishing", "launch": "launch latency"}


def draw(path, lanes, blocks, title, legend, width=10.0, height=2.6):
    """blocks: {lane index: [(start, length, kind, text or None)]}; lane 0 is drawn on top."""
    fig, ax = plt.subplots(figsize=(width, height))
    n = len(lanes)
    end = 0.0
    for lane, items in blocks.items():
        y = n - 1 - lane
        for start, length, kind, text in items:
            ax.add_patch(Rectangle((start, y + 0.1), length, 0.8, facecolor=COLORS[kind],
                                   edgecolor="black", linewidth=0.6))
            if text and length >= 0.4:
                ax.text(start + length / 2, y + 0.5, text, ha="center", va="center", fontsize=7,
                        color="white" if kind in ("S", "PV", "work", "prologue", "drain") else "black")
            end = max(end, start + length)
    for i, name in enumerate(lanes):
        ax.text(-0.15, n - 1 - i + 0.5, name, ha="right", va="center", fontsize=8)
    ax.set_xlim(-2.6, end + 0.2)
    ax.set_ylim(-0.1, n)
    ax.axis("off")
    ax.set_title(title, fontsize=8)
    ax.legend(handles=[Patch(facecolor=COLORS[k], edgecolor="black", label=LABELS[k]) for k in legend],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(legend), fontsize=7,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def pingpong(path, tiles=3, g=1.0, soft=0.8):
    """Each turn issues one tile's two products (2g of tensor time); the other warpgroup's softmax
    (soft < 2g) runs meanwhile, so the tensor cores go from one warpgroup's products to the other's."""
    blocks = {0: [], 1: [], 2: []}
    t = 0.0
    for i in range(tiles):
        for wg in (0, 1):
            blocks[2].append((t, g, "S", f"WG{wg + 1} S"))
            blocks[2].append((t + g, g, "PV", f"WG{wg + 1} PV"))
            blocks[wg].append((t, 2 * g, "wait", "its products run"))
            blocks[wg].append((t + 2 * g, soft, "softmax", "softmax"))
            blocks[wg].append((t + 2 * g + soft, 2 * g - soft, "wait", "turn"))
            t += 2 * g
    draw(path, ["consumer WG 1", "consumer WG 2", "tensor cores"], blocks,
         "Pingpong: a warpgroup's softmax runs while the other's products keep the tensor cores busy",
         ["S", "PV", "softmax", "wait"])


def intra(path, tiles=3, g=1.0, soft=0.8):
    """One warpgroup: its turn issues S(t) and P(t-1).V(t-1); it waits for S(t) alone (wait<1>),
    computes softmax(t) while P(t-1).V(t-1) runs, then waits for it and rescales O."""
    blocks = {0: [], 1: []}
    t = 0.0
    blocks[1].append((t, g, "S", "S(0)"))
    blocks[0].append((t + g, soft, "softmax", "softmax(0)"))
    t += g + soft
    for i in range(1, tiles):
        blocks[1].append((t, g, "S", f"S({i})"))
        blocks[1].append((t + g, g, "PV", f"P({i - 1}).V({i - 1})"))
        blocks[0].append((t, g, "wait", "wait<1>"))
        blocks[0].append((t + g, soft, "softmax", f"softmax({i})"))
        blocks[0].append((t + g + soft, g - soft, "wait", "wait<0>"))
        t += 2 * g
    draw(path, ["warpgroup", "tensor cores"], blocks,
         "Inside a warpgroup: S(t) and P(t-1).V(t-1) issued together; softmax(t) runs during P(t-1).V(t-1)",
         ["S", "PV", "softmax", "wait"], height=2.2)


def pdl(path):
    """A short launch: launch latency, prologue, loads and products, the drain of its last CTAs."""
    def launch(t0, wait_until=None):
        items = [(t0, 0.6, "launch", None), (t0 + 0.6, 0.5, "prologue", "prologue")]
        start = max(t0 + 1.1, wait_until or 0.0)
        return items + [(start, 2.0, "work", "work"), (start + 2.0, 0.5, "drain", "drain")]
    blocks = {0: launch(0.0), 1: launch(3.6), 2: launch(0.0), 3: launch(1.6, wait_until=3.6)}
    draw(path, ["plain: launch 1", "launch 2", "with PDL: launch 1", "launch 2"], blocks,
         "Programmatic dependent launch: launch 2 starts and runs its prologue while launch 1 "
         "drains, and waits (cudaGridDependencySynchronize) before its first load",
         ["launch", "prologue", "work", "drain"], height=3.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", help="folder for the pictures (default docs/img)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pingpong(os.path.join(args.out, "07_pingpong.png"))
    intra(os.path.join(args.out, "07_intra.png"))
    pdl(os.path.join(args.out, "07_pdl.png"))
    print(f"wrote 07_pingpong.png, 07_intra.png and 07_pdl.png in {args.out}")


if __name__ == "__main__":
    main()
