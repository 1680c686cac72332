#!/usr/bin/env bash
# Run 6b: why the greedy-text step of run 6 failed. Each prompt greedy on cuda:0 with the
# current kernels, the legacy ones and the decode products in one chain (no-decode-lanes),
# each once as the GPU's argmax gives it and once with every pass's logits read back
# (--gaps: the best logit minus the runner-up per token).
set -uo pipefail
cd "$(dirname "$0")/.."
H=v4/ggml-harness
cat kit/model/part-* > /tmp/model.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/model.gguf" | sha256sum -c - || exit 1
m=/tmp/model.gguf
out=${OUT:-/tmp/out}; mkdir -p $out
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $out/gpu.txt
i=0
for p in "The GNU General Public License is" "Once upon a time,"; do
  i=$((i + 1))
  for t in default legacy no-decode-lanes; do
    $H generate --model $m --devices cuda:0 -n 128 --json --cuda-tuning $t -p "$p" > $out/generate$i-$t.json
    $H generate --model $m --devices cuda:0 -n 128 --json --gaps --cuda-tuning $t -p "$p" > $out/generate$i-$t-gaps.json
  done
  $H generate --model $m --devices cpu -n 128 --json --gaps -p "$p" > $out/generate$i-cpu-gaps.json
done
ls -la $out
