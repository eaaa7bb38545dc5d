"""The data a run reads: checked in full up front, then served as reproducible tf.data pipelines.

pipeline.py  load_data(settings): a built-in data set, an .npz or an image directory -> checked
             arrays, fingerprint, split, and each replica's slice of a batch
images.py    images:<dir>: listing, fingerprinting, decoding once, the decode cache
arrays.py    arrays in the Keras layout: an .npz read in full, every array checked; the split and
             the tf.data options every source shares
"""
