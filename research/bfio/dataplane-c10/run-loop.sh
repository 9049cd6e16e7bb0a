#!/bin/bash
# C10 run loop (research/bfio.md, C10): one dlb bfio dataplane per seed and setting, uptime before/after.
set -u
W=/tmp/c10wt; OUT=/work/main/research/bfio/dataplane-c10; PY=/work/main/.venv/bin/python
cd $W
commit=$(git rev-parse --short HEAD); dirty=$(git status --porcelain | wc -l)
run() { name=$1; shift
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $name $* commit $commit dirty=$dirty" >> $OUT/log.txt
  PYTHONPATH=$W $PY -m dlb bfio dataplane "$@" --policies jsq,bf-io --hold 10000 --time-scale 8 --json $OUT/$name.json > $OUT/$name.txt 2>&1
  echo "$(date -u +%H:%M:%S) done $name rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
}
for s in 401 402 403 404 405 406; do
  run g8-above-s$s --G 8 --B 32 --rate 70 --requests 400 --seeds $s
  run g16-above-s$s --G 16 --B 16 --rate 70 --requests 400 --seeds $s
done
for s in 401 402 403 404 405 406; do
  run g8-below-s$s --G 8 --B 32 --rate 5 --requests 240 --seeds $s
  run g16-below-s$s --G 16 --B 16 --rate 8 --requests 240 --seeds $s
done
echo "$(date -u +%H:%M:%S) all done" >> $OUT/log.txt
