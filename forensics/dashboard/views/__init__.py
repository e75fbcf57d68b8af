"""The dashboard's views, one module each; every ``render(run)`` takes the :class:`~forensics.dashboard.LiveRun`.

The head (:mod:`header`) and the curve (:mod:`run`) are always drawn; the switch under the curve picks one of
:data:`VIEWS`.
"""

from forensics.dashboard.views import buckets, causes, composition, header, inspector, run

#: The views in the order the view switch lists them: label -> render function.
VIEWS = {
    "Causes": causes.render,
    "Buckets & clusters": buckets.render,
    "Composition": composition.render,
    "Step inspector": inspector.render,
}

__all__ = ["VIEWS", "buckets", "causes", "composition", "header", "inspector", "run"]
