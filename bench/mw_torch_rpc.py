"""Master-worker mode against torch.distributed.rpc (TensorPipe), side by side in one run.

    .venv-bench/bin/python bench/mw_torch_rpc.py [--json out.json] [--reps 5] [--backend tcp]

The same as ``procgroup-bench master-worker --compare torch`` (its options pass through;
see core/procgroup/bench/_master_worker.py for what is measured). .venv-bench
(scripts/setup-bench-venv.sh) holds procgroup, the tcp backend and torch; without torch
only procgroup's side is measured.
"""

from __future__ import annotations

import sys

from procgroup.bench import main

if __name__ == "__main__":
    raise SystemExit(main(["master-worker", "--compare", "torch", *sys.argv[1:]]))
