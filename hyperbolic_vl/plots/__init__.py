"""Pictures of the geometry: disk views, distance histograms, traversal
strips, interpolations, entailment cones and training curves.

Each figure function takes embeddings (or a run's metrics) and returns a
`matplotlib.figure.Figure`; nothing here uses pyplot's global state, so the
functions work headless and in notebooks alike (`fig.savefig(path)`, or the
figure as a cell's last expression). matplotlib is the optional "plots"
extra; nothing in training or evaluation imports this package.

    from hyperbolic_vl import plots
    space = plots.Space.of(model)            # a hyperbolic_vl.load(...) model
    plots.disk_view(space, image_emb, text_emb).savefig("disk.png")

`python -m hyperbolic_vl.plot --workdir=RUN` writes them all for a run.
"""

from hyperbolic_vl.plots.embedding_views import cone_view, disk_view, distance_histograms
from hyperbolic_vl.plots.layout import Space
from hyperbolic_vl.plots.safety_views import safety_view
from hyperbolic_vl.plots.training_curves import compare_curves, read_curves, training_curves
from hyperbolic_vl.plots.walk_views import interpolation_strip, traversal_strips

__all__ = [
  "Space",
  "compare_curves",
  "cone_view",
  "disk_view",
  "distance_histograms",
  "interpolation_strip",
  "read_curves",
  "safety_view",
  "training_curves",
  "traversal_strips",
]
