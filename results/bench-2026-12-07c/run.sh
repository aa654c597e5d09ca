#!/bin/bash
# alternating before/after pairs: CAPE forward+backward and CAPE decoding
cd /tmp
OUT=/work/main/results/bench-2026-12-07c
for pair in 1 2; do
 for side in before after; do
  if [ $side = before ]; then PP=/tmp/before-8e658ed; else PP=/work/main; fi
  PYTHONPATH=$PP /work/main/.venv/bin/python -c "import posenc.cli,posenc;print(posenc.__file__)" >> $OUT/log-which.txt
  PYTHONPATH=$PP /work/main/.venv/bin/posenc bench attention --encodings none,cape --no-peers --linear-encodings off --repeats 7 --out $OUT/attention-$side-run$pair > $OUT/log-attention-$side-$pair.txt 2>&1
  echo "attention $side $pair $(date -u +%T) $(cat /proc/loadavg)" >> $OUT/walls.txt
  PYTHONPATH=$PP /work/main/.venv/bin/posenc bench generate --encodings rope,cape --contexts 512,2048 --batches 1,8 --decode-tokens 8 --repeats 6 --threads 1 --no-peers --out $OUT/generate-$side-run$pair > $OUT/log-generate-$side-$pair.txt 2>&1
  echo "generate $side $pair $(date -u +%T) $(cat /proc/loadavg)" >> $OUT/walls.txt
 done
done
echo done >> $OUT/walls.txt
