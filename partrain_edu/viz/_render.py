"""Figures to PNG bytes, fast: one Agg draw and a quick encoder (``render_png``), or, for a widget whose
picture mostly stays, only what changed drawn over kept pixels (``Layered``: matplotlib's blitting).

Every redraw of a widget ends here, so the costs are the widgets' costs: a full draw of a figure is tens of
milliseconds (mostly text: every label is laid out and rasterised again), a figure built from scratch ten
more, encoding the PNG a few. Hence: build the frame once, keep its pixels, draw only the data.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable, Hashable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import Container
from matplotlib.figure import Figure

DPI = 100


def _agg(fig: Figure) -> FigureCanvasAgg:
    plt.close(fig)  # out of pyplot's list: no leak, and the inline backend will not show it a second time
    canvas = FigureCanvasAgg(fig)  # Agg whatever the notebook's backend: we only want the pixels
    fig.set_dpi(DPI)
    fig.patch.set_facecolor("white")  # the inline backend's transparent default reads badly on dark themes
    return canvas


def _encode(canvas: FigureCanvasAgg) -> bytes:
    """The canvas as PNG: no row filter, zlib level 1. PIL's encoder spends most of its ~13 ms choosing a
    filter per row; unfiltered, a flat-coloured plot compresses about as well in a third of the time."""
    width, height = canvas.get_width_height()
    rows = np.empty((height, 1 + 4 * width), dtype=np.uint8)
    rows[:, 0] = 0  # each row starts with its filter type: 0, none
    rows[:, 1:] = np.asarray(canvas.buffer_rgba()).reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA, not interlaced
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.data, 1))
            + _chunk(b"IEND", b""))


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def render_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, from one Agg draw; the figure is closed but stays readable."""
    canvas = _agg(fig)
    canvas.draw()
    return _encode(canvas)


def _parts(artists: list) -> list:
    return [p for a in artists for p in (a if isinstance(a, Container) else [a])]


class Layered:
    """Redraw only what changed: matplotlib's blitting, for widgets whose frame rarely changes.

    ``paint(key, frame, data, middle=None)``: when ``key`` differs from last time, ``frame()`` builds a new
    figure (axes, ticks, legend), drawn once and its pixels kept. ``data(fig)`` adds the artists that show
    the numbers and returns them; only they are drawn, over the kept pixels. ``middle=(key, add)`` is a layer
    in between, redrawn (and its pixels kept) only when its key changes: a scale or a title that moves less
    often than the data. A layer may also return artists the frame made and it updates in place (an axis
    whose ticks follow the data, a title, a spine the bars must not cover): those stay; what a layer
    created is removed when that layer is next redrawn.
    """

    def __init__(self):
        self.fig = None
        self.canvas = None
        self.keys = []
        self.framed = set()
        self.layers: list[tuple[list, object]] = []  # per key: (what that layer added, the pixels after it)
        self.data: list = []

    def paint(self, key: Hashable, frame: Callable[[], Figure], data: Callable[[Figure], list],
              middle: tuple[Hashable, Callable[[Figure], list]] | None = None) -> tuple[Figure, bytes]:
        try:
            return self._paint(key, frame, data, middle)
        except Exception:
            self.fig = None  # half drawn: the next call starts again from a new frame
            raise

    def _paint(self, key, frame, data, middle) -> tuple[Figure, bytes]:
        keys, adds = [key], [None]
        if middle:
            keys.append(middle[0])
            adds.append(middle[1])
        kept = 0  # how many layers, from the frame up, are still as last drawn
        while self.fig is not None and kept < min(len(keys), len(self.keys)) and keys[kept] == self.keys[kept]:
            kept += 1
        if kept:
            for artists in [self.data] + [layer[0] for layer in self.layers[kept:]]:
                self._remove(artists)
        else:
            self.fig = frame()
            self.canvas = _agg(self.fig)
            # what layers may update but must not remove: the figure's and the axes' own artists (not
            # findobj(), which would walk, and create, every tick)
            self.framed = {a for owner in (self.fig, *self.fig.axes) for a in owner.get_children()}
        self.keys, self.layers = keys, self.layers[:kept] if kept else [([], None)]
        added = [adds[i](self.fig) for i in range(max(kept, 1), len(keys))]
        self.data = data(self.fig)
        if not kept:
            for part in _parts([a for layer in added for a in layer] + self.data):
                part.set_animated(True)  # left out of the full draw: that draw is the frame alone
            self.canvas.draw()
            self.layers[0] = ([], self.canvas.copy_from_bbox(self.fig.bbox))
        else:
            self.canvas.restore_region(self.layers[-1][1])
        for artists in added:
            self._draw(artists)
            self.layers.append((artists, self.canvas.copy_from_bbox(self.fig.bbox)))
        self._draw(self.data)
        return self.fig, _encode(self.canvas)

    def _remove(self, artists: list) -> None:
        for artist in artists:
            if artist not in self.framed:
                artist.remove()

    def _draw(self, artists: list) -> None:
        renderer = self.canvas.get_renderer()
        for part in sorted(_parts(artists), key=lambda a: a.get_zorder()):  # the order a full draw would use
            part.draw(renderer)
            part.set_animated(False)  # so the figure also shows them when saved the ordinary way
