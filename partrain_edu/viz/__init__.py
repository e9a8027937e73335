"""Figures (pure functions returning a matplotlib Figure) and, on top, the interactive widgets."""
from partrain_edu.viz.overview import parallel_axes_figure

__all__ = ["parallel_axes_figure"]
