"""Settings for the in-process unit tests (``pytest -m unit``)."""

from __future__ import annotations

from hypothesis import settings

# No per-example deadline: the suite shares small, loaded machines, where a slow example
# is the scheduler's doing, not the code's; and a bounded number of examples keeps the
# whole unit run short.
settings.register_profile("procgroup-unit", deadline=None, max_examples=100)
settings.load_profile("procgroup-unit")
