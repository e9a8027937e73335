"""One colour language for every figure in the course (DESIGN.md, STYLE.md): the same thing is always the
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
