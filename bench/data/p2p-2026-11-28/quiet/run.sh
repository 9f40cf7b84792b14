#!/bin/bash
# p2p quiet window 12:00-12:11: final figures. Raw outputs under /tmp/p2p3/quiet/
cd /work/main
OUT=/tmp/p2p3/quiet; mkdir -p $OUT
ld() { echo "$1 $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $OUT/load.txt; }
ld start
rm -rf $OUT/before $OUT/after; mkdir -p $OUT/before/backends $OUT/after/backends
cp -r backends/tcp $OUT/before/backends/; cp -r backends/tcp $OUT/after/backends/
for f in _p2p.py _ring.py; do git show 5335576:backends/tcp/procgroup_tcp/$f > $OUT/before/backends/tcp/procgroup_tcp/$f; done
git rev-parse HEAD > $OUT/head.txt
B=.venv313/bin/procgroup-bench
$B -np 2 -B "tcp,tcp[shm_stream_max_bytes=33554432]" --compare raw -o pingpong --sizes 8,4K,64K,4M,16M,64M -n 200 --rounds 5 -q --json $OUT/pp1.json > $OUT/pp1.txt 2>&1; ld pp1
$B -np 2 -B tcp --compare raw -o pingpong --sizes 8,4K,64K,4M,16M,64M -n 200 --rounds 5 -q --json $OUT/pp2.json > $OUT/pp2.txt 2>&1; ld pp2
$B -np 2 -B tcp --compare raw -o all_reduce --sizes 8,4M,64M -n 50 --rounds 3 -q --json $OUT/ar1.json > $OUT/ar1.txt 2>&1; ld ar1
$B -np 2 -B tcp --compare raw -o pingpong --sizes 8,4M,64M -n 200 --rounds 5 -q --json $OUT/pp3.json > $OUT/pp3.txt 2>&1; ld pp3
timeout 150 .venv313/bin/python bench/mpi_overhead.py --op sendrecv --sizes 8 > $OUT/mpi1.txt 2>&1; ld mpi1
timeout 150 .venv313/bin/python bench/mpi_overhead.py --op sendrecv --sizes 8 > $OUT/mpi2.txt 2>&1; ld mpi2
$B -np 2 -B tcp --compare raw -o all_reduce --sizes 8,4M,64M -n 50 --rounds 3 -q --json $OUT/ar2.json > $OUT/ar2.txt 2>&1; ld ar2
for i in 1 2 3; do for v in before after; do for n in 8 65536; do
  r=$(PYTHONPATH=$OUT/$v/backends/tcp timeout 60 .venv313/bin/python bench/latency_loop.py --op pingpong --nbytes $n --iters 5000 --rounds 5 2>&1 | tail -1)
  echo "$v $n $(cat /proc/loadavg | cut -d' ' -f1) $r" >> $OUT/loops.txt
done; done; done
ld end
