"""A reproducible TensorFlow training template: `train(settings)` and the pieces around it.

Importing the package imports no TensorFlow; `train.training.fit.train` does, after the settings are valid.
"""

__version__ = "0.1.0"
