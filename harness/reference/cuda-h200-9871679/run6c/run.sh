#!/usr/bin/env bash
# Run 6c: Nsight Compute's full set on one token's six decode kernels (the output
# projection + add, the output head, Q-K-V + RoPE + store, flash_attn_row, down + add,
# gate-up + GLU), with per-instruction (SASS) stall sampling, to see where the blocks'
# time goes.
set -uo pipefail
cd "$(dirname "$0")/.."
H=v4/ggml-harness
cat kit/model/part-* > /tmp/model.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/model.gguf" | sha256sum -c - || exit 1
m=/tmp/model.gguf
out=${OUT:-/tmp/out}; mkdir -p $out; w=/tmp/w; mkdir -p $w
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $w/gpu.txt
ncu --version | tee $w/ncu-version.txt
time ncu --set full --import-source no -k regex:'qmm|flash_attn_row' --launch-skip 300 \
  --launch-count 6 -o $w/decode -f $H bench --model $m --devices cuda:0 -p 0 -n 16 -r 1 \
  > $w/ncu-log.txt 2>&1
echo "ncu rc=$?"; tail -5 $w/ncu-log.txt
ncu --import $w/decode.ncu-rep --page details --print-details all > $w/details.txt 2>&1
ncu --import $w/decode.ncu-rep --page raw --csv > $w/raw.csv 2>&1
ncu --import $w/decode.ncu-rep --page source --csv --print-source sass > $w/source-sass.csv 2>&1
echo "source rc=$?"; head -c 600 $w/source-sass.csv; echo
ls -la $w
tar czf $out/run6c.tgz -C $w .
ls -la $out
