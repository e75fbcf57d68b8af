"""The dashboard's views, one module each; every ``render(run)`` takes the :class:`~forensics.dashboard.LiveRun`."""

from forensics.dashboard.views import buckets, causes, composition, header, inspector, run

#: The views in the order the view switch lists them: label -> render function.
VIEWS = {
    "Run": run.render,
    "Buckets & clusters": buckets.render,
    "Composition": composition.render,
    "Causes": causes.render,
    "Step inspector": inspector.render,
}

__all__ = ["VIEWS", "buckets", "causes", "composition", "header", "inspector", "run"]
