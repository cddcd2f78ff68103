set -o pipefail
cmake --preset default >/dev/null && cmake --build build -j16 2>&1 | tail -1
ctest --test-dir build --output-on-failure 2>&1 | tail -4 | tee $OUT/test.log
tools/sanitize.sh build/tests/test_gpu 2>&1 | grep -E "SUMMARY|==" | tee $OUT/sanitize.log
for sh in seed decode_b1_sk131072 decode_b8_sk32768 decode_b1_sk4096 prefill_d128_s4096_causal prefill_d64_s1024; do build/bench/attn_runner --shape $sh 2>&1 | grep -E "^0|shape"; done | tee $OUT/runner.log
for sh in decode_b1_sk131072 seed; do build/stages/02_kv_split/02_kv_split --shape $sh | grep launch; done
ncu --clock-control none -k regex:kv_split_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --metrics smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum build/stages/02_kv_split/02_kv_split --shape decode_b8_sk32768 --no-check > $OUT/ncu02b8.txt 2>&1; grep -E "Throughput|Duration|Warp Cycles|Achieved|smsp__|stalled" $OUT/ncu02b8.txt | head -20
