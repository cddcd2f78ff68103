#!/usr/bin/env bash
# Power and clock beside the timing, on a GPU machine: stage 07 (attn_bench, six repetitions of its
# one-second timing, then one) and cuDNN (tools/power_cudnn.py, six seconds, then one) on
# prefill_d128_s4096, with nvidia-smi sampling power and SM clock every 50 ms. Prints each phase's
# time and its mean power and clock. Needs build/bench/attn_bench (tools/gpu_run.sh build).
# Usage: OUT=... tools/power_run.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; : > "$OUT/phases.txt"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 50 > "$OUT/smi.csv" &
smi=$!
ph() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $1" >> "$OUT/phases.txt"; }
bench() { build/bench/attn_bench --attn_stages=07_overlap --attn_shapes=prefill_d128_s4096 \
            --benchmark_repetitions="$1" --benchmark_out="$OUT/07_$2.json" > "$OUT/07_$2.txt" 2>&1; }
sleep 3
ph s07_6s; bench 6 6s; ph e07_6s; sleep 4
ph scudnn_6s; python3 tools/power_cudnn.py 6 | tee "$OUT/cudnn_6s.txt"; ph ecudnn_6s; sleep 4
ph s07_1s; bench 1 1s; ph e07_1s; sleep 4
ph scudnn_1s; python3 tools/power_cudnn.py 1 | tee "$OUT/cudnn_1s.txt"; ph ecudnn_1s
kill "$smi"
cat "$OUT/07_6s.txt" "$OUT/07_1s.txt" | sed "s/\x1b\[[0-9;]*m//g" | grep -a "prefill_d128_s4096 " | cut -c1-90
python3 - "$OUT" <<'PY'
import sys
out = sys.argv[1]
def secs(x):
    h, m, s = x.split(':')
    return int(h) * 3600 + int(m) * 60 + float(s)
marks = {name: secs(t) for t, name in (l.split() for l in open(out + '/phases.txt'))}
rows = []
for line in open(out + '/smi.csv'):
    f = [x.strip() for x in line.split(',')]
    try:
        rows.append((secs(f[0].split()[1]), float(f[1].split()[0]), float(f[2].split()[0])))
    except (IndexError, ValueError):
        pass
for name in sorted({n[1:] for n in marks if n.startswith('s')}):
    busy = [r for r in rows if marks['s' + name] <= r[0] <= marks['e' + name] and r[1] > 250]
    if busy:
        print(f"{name:10s} {len(busy):4d} samples  power {sum(r[1] for r in busy) / len(busy):6.1f} W"
              f"  SM clock {sum(r[2] for r in busy) / len(busy):6.0f} MHz")
PY
