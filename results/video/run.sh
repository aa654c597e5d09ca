#!/bin/bash
# the guide's video command, 5 encodings x 3 seeds; resumable (a finished run is skipped)
cd /work/main
for e in none sincos3d axial3d rope3d rope; do for s in 0 1 2; do
  d=runs/video/$e-s$s
  if [ -f $d/results.json ]; then continue; fi
  rm -rf $d
  nice -n 10 .venv/bin/posenc train vision --video --encoding $e --seed $s --steps 600 --dim 64 --depth 3 --heads 4 --batch-size 32 --no-progress --out $d > /tmp/video-$e-$s.log 2>&1 || echo "FAILED $e $s" >> /tmp/video-failed.txt
  mkdir -p results/video/$e-s$s && cp $d/results.json $d/metrics.jsonl results/video/$e-s$s/ 2>/dev/null
  echo "$e $s $(date -u +%T)" >> /tmp/video-progress.txt
done; done
echo done >> /tmp/video-progress.txt
