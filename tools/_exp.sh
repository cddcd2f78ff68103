set -o pipefail
cmake --preset default >/dev/null && cmake --build build -j16 2>&1 | tail -1
for sh in seed prefill_d128_s4096 prefill_d128_s4096_causal prefill_d64_s4096 decode_b1_sk131072 decode_b8_sk32768; do build/bench/attn_runner --shape $sh 2>&1 | grep -E "^0|shape|rror"; done | tee $OUT/runner.log
ctest --test-dir build --output-on-failure 2>&1 | grep -vE "^\[doctest\] (test|assert)" | tail -40 | tee $OUT/test.log
tools/sanitize.sh build/tests/test_gpu 2>&1 | grep -E "SUMMARY|==|rror" | head -20 | tee $OUT/sanitize.log
