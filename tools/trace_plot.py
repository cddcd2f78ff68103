#!/usr/bin/env python3
"""A measured timeline of stages 06 and 07 from the stamps a -DATTN_TRACE build prints
(common/trace.cuh): one CTA's first work item, thread 0 of each consumer warpgroup. A build with
-DATTN_TRACE prints them; tools/trace_run.sh builds one and runs this script. By hand:

    build-trace/stages/07_overlap/07_overlap --shape prefill_d128_s4096 --no-check 2> trace.txt
    python3 tools/trace_plot.py trace.txt --png docs/img/07_trace.png

Prints, per stage and warpgroup, the mean cycles of each phase over the tiles after the first two,
and draws the phases of the first tiles.
"""
import argparse
import collections
import statistics
import sys

# Phases between events, per stage: (from event, to event, name).
PHASES = {
    "06_warp_specialized": [(0, 1, "wait K"), (1, 3, "S"), (3, 4, "softmax"), (4, 7, "wait V"),
                            (7, 5, "P.V")],
    "07_overlap": [(0, 7, "wait K, V"), (7, 1, "wait turn"), (1, 2, "issue"), (2, 3, "wait S"), (3, 4, "softmax"),
                   (4, 5, "wait P.V"), (5, 6, "rescale, P")],
}
COLORS = {"wait K": "#dddddd", "S": "#4c72b0", "softmax": "#dd8452", "wait V": "#dddddd",
          "P.V": "#55a868", "wait K, V": "#dddddd", "wait turn": "#f2e6a0", "issue": "#8172b2", "wait S": "#9db8dc",
          "wait P.V": "#a6d1ac", "rescale, P": "#c44e52"}


def read(path):
    """{stage: {group: {tile: {event: cycles}}}} from the lines `trace stage g t e cycles`."""
    data = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(dict)))
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 6 and parts[0] == "trace":
                stage, g, t, e, c = parts[1], int(parts[2]), int(parts[3]), int(parts[4]), int(parts[5])
                data[stage][g][t][e] = c
    return data


def summary(data):
    for stage, groups in data.items():
        for g, tiles in sorted(groups.items()):
            rows = []
            for a, b, name in PHASES.get(stage, []):
                d = [ev[b] - ev[a] for t, ev in tiles.items() if t >= 2 and a in ev and b in ev]
                if d:
                    rows.append(f"{name} {statistics.mean(d):.0f}")
            starts = sorted(ev[0] for t, ev in tiles.items() if 0 in ev)
            period = statistics.mean(b - a for a, b in zip(starts[2:], starts[3:])) if len(starts) > 3 else 0
            print(f"{stage} warpgroup {g}: tile period {period:.0f} cycles; " + ", ".join(rows))


def draw(data, png, tiles_shown):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    stages = [s for s in PHASES if s in data]
    fig, axes = plt.subplots(len(stages), 1, figsize=(11, 1.6 + 1.1 * len(stages)), squeeze=False)
    for ax, stage in zip(axes[:, 0], stages):
        groups = data[stage]
        t0 = min(ev[0] for tiles in groups.values() for t, ev in tiles.items() if 0 in ev and t == 2)
        end = 0
        for g, tiles in sorted(groups.items()):
            for t, ev in tiles.items():
                if not 2 <= t < 2 + tiles_shown:
                    continue
                for a, b, name in PHASES[stage]:
                    if a in ev and b in ev:
                        x0, x1 = ev[a] - t0, ev[b] - t0
                        ax.add_patch(Rectangle((x0, -g - 0.4), x1 - x0, 0.8, facecolor=COLORS[name],
                                               edgecolor="black", linewidth=0.3))
                        end = max(end, x1)
        ax.set_xlim(0, end)
        ax.set_ylim(-len(groups) + 0.4, 0.6)
        ax.set_yticks([-g for g in sorted(groups)])
        ax.set_yticklabels([f"WG {g + 1}" for g in sorted(groups)])
        ax.set_title(f"{stage}: tiles 2-{1 + tiles_shown} of CTA 0's first item (SM cycles)", fontsize=8)
        ax.legend(handles=[Patch(facecolor=COLORS[n], edgecolor="black", label=n) for _, _, n in PHASES[stage]],
                  loc="upper right", fontsize=6, ncol=len(PHASES[stage]))
    fig.tight_layout()
    fig.savefig(png, dpi=130)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="stderr of a -DATTN_TRACE stage program")
    parser.add_argument("--png", help="draw the timeline into this file")
    parser.add_argument("--tiles", type=int, default=4, help="tiles drawn (default 4)")
    args = parser.parse_args()
    data = read(args.trace)
    if not data:
        sys.exit(f"trace_plot.py: no `trace` lines in {args.trace}")
    summary(data)
    if args.png:
        draw(data, args.png, args.tiles)


if __name__ == "__main__":
    main()
