"""Internals of ``procgroup-run`` (the launcher); the public entry point is :mod:`procgroup.run`.

Modules:

- ``options``: the validated launch configuration.
- ``ports``: a free master port without a bind race.
- ``output``: per-rank output pumps (prefixing, log files).
- ``supervisor``: starting, watching and stopping the local ranks.
- ``rankside``: what runs *inside* a rank (bootstrap and error-file excepthook); stdlib
  only, so it also runs by path without importing procgroup.
"""
