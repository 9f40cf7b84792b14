#!/bin/bash
# alternated before/after 8 B pingpong loops
cd /work/main
for i in 1 2 3 4 5; do
  for v in before after; do
    r=$(PYTHONPATH=/tmp/p2p3/$v/backends/tcp timeout 120 .venv313/bin/python bench/latency_loop.py --op pingpong --nbytes 8 --iters 20000 2>&1 | tail -1)
    echo "$v $(cut -d' ' -f1-3 /proc/loadavg) $r"
  done
done
