"""One colour language for every figure in the course (docs/figures.md): the same thing is always the
same colour — model states and activations, forward / backward / weight-gradient work, and each rank."""

# What lives in memory
PARAMS = "#4C72B0"      # blue
GRADS = "#DD8452"       # orange
OPTIMIZER = "#55A868"   # green
ACTIVATIONS = "#8172B3"  # purple
# What a pipeline stage is doing
FORWARD = "#64B5CD"     # light blue
BACKWARD = "#C44E52"    # red
WEIGHT_GRAD = "#CCB974"  # sand
IDLE = "#E5E5E5"        # grey: a bubble
# Ranks (devices): a qualitative palette, rank k is always RANKS[k % len(RANKS)]
RANKS = ["#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#666666"]


def rank_color(rank: int) -> str:
    return RANKS[rank % len(RANKS)]

# Verdicts and helpers
FITS = "#2E7D32"        # dark green: fits the device / fast enough
OVER = "#C62828"        # dark red: out of memory / too slow
TRANSIENT = "#9E9E9E"   # grey: short-lived buffers (gathered layers, recompute)
INK = "#333333"         # text and reference lines


def lighten(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white: 0 keeps it, 1 is white (a second model chunk, a faded bar)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(color))


def clean(ax, keep=("left", "bottom")) -> None:
    """Drop the box around an axes except the ``keep`` sides: less ink, the data stands out."""
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(side in keep)
