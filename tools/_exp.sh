set -o pipefail
cmake --preset default >/dev/null && cmake --build build -j16 2>&1 | tail -1
for v in 1 2; do
  cmake -S . -B build-h$v -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_FLAGS=-DATTN_KVS_MAXHPW=$v" -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCH=OFF >/dev/null && cmake --build build-h$v -j16 --target attn_stage_02_kv_split_main 2>&1 | tail -1 &
done
wait
for b in build build-h1 build-h2; do for sh in decode_b1_sk131072 decode_b8_sk32768 decode_b1_sk4096 seed; do echo "$b $sh $($b/stages/02_kv_split/02_kv_split --shape $sh | grep -E "^launch|GB/s|^time" | grep -oE "[0-9.]+ us median|[0-9.]+ GB/s =|[0-9]+ registers|num_splits=[0-9]+|Br=[0-9]+ warp rows of [0-9]" | tr '\n' ' ')"; done; done 2>&1 | tee $OUT/variants.log
for sh in seed prefill_d128_s4096_causal prefill_d64_s1024; do build/bench/attn_runner --shape $sh 2>&1 | grep -E "^0|shape"; done | tee $OUT/runner.log
ctest --test-dir build 2>&1 | tail -3
