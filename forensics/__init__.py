"""loss-spike forensics: why did the training loss spike, down to the batch and the samples.

The pipeline's stages are subpackages that talk through the tables of :mod:`forensics.schema`:
``sources`` (metrics), ``plan`` (which samples made each optimizer step), ``tagging`` (per-step bucket and
cluster), ``detect`` (findings), ``report`` (figures and HTML). The CLI and ``app.py`` only parse and render.

Importing the package, or any of its modules, changes nothing in the importing process: no environment variable,
thread pool, garbage-collector setting or signal handler (a training script imports the recorder). Only the
``forensics`` command sizes its own process (:func:`forensics.cli.process.size_this_process`).
"""

__version__ = "0.1.0"
