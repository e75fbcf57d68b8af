"""loss-spike forensics: why did the training loss spike, down to the batch and the samples.

The pipeline's stages are subpackages that talk through the tables of :mod:`forensics.schema`:
``sources`` (metrics), ``plan`` (which samples made each optimizer step), ``tagging`` (per-step bucket and
cluster), ``detect`` (findings), ``report`` (figures and HTML). The CLI and ``app.py`` only parse and render.
"""

__version__ = "0.1.0"
