"""Checkpoint layouts in and out: native hf-dspark folders (and, later, serving-engine and DFlash layouts)."""

from .loading import detect_layout, load_drafter

__all__ = ["detect_layout", "load_drafter"]
