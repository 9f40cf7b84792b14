"""``python -m procgroup.bench``: the same as the procgroup-bench console script."""

from procgroup.bench import main

raise SystemExit(main())
