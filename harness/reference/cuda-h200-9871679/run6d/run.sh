#!/usr/bin/env bash
# Run 6d: the qmm variants (an entry compiled per dtype and fused form for decode-class
# launches, the `specialize` tuning) on the driver: the fusion, Q-K-V + RoPE and MoE tests
# (digests recorded for the comparison with cuda-sim), greedy tokens with and without
# variants, tg128/pp512 alternated default / no-specialize, and Nsight Compute's full set
# on one token's six decode kernels as in run 6c.
set -uo pipefail
cd "$(dirname "$0")/.."
cat kit/model/part-* > /tmp/model.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/model.gguf" | sha256sum -c - || exit 1
m=/tmp/model.gguf; H=v5/ggml-harness
out=${OUT:-/tmp/out}; w=/tmp/w6d; mkdir -p $out $w
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $w/gpu.txt
export GGML_RS_KERNEL_RESULTS=$w/gpu-kernel-results.txt
for t in fusion qkv_rope moe; do
  s=$SECONDS
  GGML_RS_REQUIRE_GPU=1 v5/$t --test-threads 1 > $w/test-$t.txt 2>&1; echo "test $t rc=$? $((SECONDS - s)) s"
  grep -E '^test result|FAILED|panicked' $w/test-$t.txt | head -5
done
unset GGML_RS_KERNEL_RESULTS
for t in default no-specialize; do
  $H generate --model $m --devices cuda:0 -n 64 --json -p "Once upon a time," --cuda-tuning $t > $w/generate-$t.json
done
cmp <(sed 's/"gen_tps[^,]*,//; s/"prompt_tps[^,]*,//' $w/generate-default.json) \
    <(sed 's/"gen_tps[^,]*,//; s/"prompt_tps[^,]*,//' $w/generate-no-specialize.json) \
  && echo "greedy: the same tokens with and without variants"
for round in 1 2; do
  for t in default no-specialize; do
    $H bench --model $m --devices cuda:0 -p 512 -n 128 -r 5 --cuda-tuning $t --json > $w/bench-$t-round$round.json 2>$w/bench-$t-round$round.err
    echo "round $round $t: $(grep -o '"test":"[a-z0-9]*"\|"tps_mean":[0-9.]*\|"tps_stddev":[0-9.]*' $w/bench-$t-round$round.json | tr '\n' ' ')"
  done
done
timeout 60 ncu --set full --import-source no -k regex:'qmm|flash_attn_row' --launch-skip 300 \
  --launch-count 6 -o $w/decode -f $H bench --model $m --devices cuda:0 -p 0 -n 16 -r 1 \
  > $w/ncu-log.txt 2>&1; echo "ncu rc=$?"
timeout 30 ncu --import $w/decode.ncu-rep --page source --csv --print-source sass > $w/source-sass.csv 2>&1
timeout 30 ncu --import $w/decode.ncu-rep --page raw --csv > $w/raw.csv 2>&1
rm -f $w/decode.ncu-rep
tar czf $out/run6d.tgz -C $w .
ls -la $out
