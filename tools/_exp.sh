set -o pipefail
cmake --preset default >/dev/null && cmake --build build -j16 2>&1 | tail -1
ctest --test-dir build --output-on-failure 2>&1 | tail -30 | tee $OUT/test.log
tools/sanitize.sh build/tests/test_gpu 2>&1 | grep -E "SUMMARY|==|rror" | head -20 | tee $OUT/sanitize.log
for sh in seed decode_b1_sk131072 decode_b8_sk32768 decode_b1_sk4096 prefill_d128_s4096_causal prefill_d128_s4096 sweep_bh16; do build/bench/attn_runner --shape $sh 2>&1 | grep -E "^0|shape"; done | tee $OUT/runner.log
