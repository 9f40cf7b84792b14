"""Helpers for training scripts built on procgroup (see :mod:`procgroup.utils.comm`)."""
