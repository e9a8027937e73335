"""Figures (pure functions returning a matplotlib Figure) and, on top, the interactive widgets.

Widgets (each a ``WidgetApp``: ``app.controls[name].value = …`` redraws as moving the control does):
``memory_widget()`` (the memory wall, ZeRO stages 0–3), ``pipeline_widget()`` (schedules and bubbles),
``traffic_widget()`` (a collective step by step; bytes per strategy and time per link), ``planner_widget()``,
``ratio_widget()`` (communication / compute per parallel axis).
Figures: ``memory_figure``, ``pipeline_figure`` (simulated or measured timelines), ``collective_figure``,
``strategy_traffic_figure``, ``planner_figure``, ``parallel_axes_figure``, ``grid_figure`` (ranks on nodes),
``roofline_figure`` (matmuls under a device's roof), ``intensity_figure`` (FSDP's FLOPs per byte as tp grows).
Colours: ``viz.palette``.
"""
from partrain_edu.viz.efficiency import ratio_widget, roofline_figure
from partrain_edu.viz.grid import grid_figure
from partrain_edu.viz.memory import memory_figure, memory_widget, zero_stage_estimates
from partrain_edu.viz.overview import parallel_axes_figure
from partrain_edu.viz.pipeline import bubble_formula, inflight_curves, pipeline_figure, pipeline_widget
from partrain_edu.viz.planner import planner_figure, planner_widget
from partrain_edu.viz.ring import collective_figure
from partrain_edu.viz.traffic import strategy_traffic, strategy_traffic_figure, traffic_widget
from partrain_edu.viz.two_d import intensity_figure

__all__ = [
    "memory_widget", "pipeline_widget", "traffic_widget", "planner_widget", "ratio_widget",
    "memory_figure", "zero_stage_estimates", "pipeline_figure", "bubble_formula", "inflight_curves",
    "collective_figure", "strategy_traffic", "strategy_traffic_figure", "planner_figure",
    "parallel_axes_figure", "grid_figure", "roofline_figure", "intensity_figure",
]
