"""Before any training: the settings file, the MODEL spec, the hardware and devices.

envfile.py     the settings file (.env): its values, and a line number for everything wrong in it
modelspec.py   MODEL=package.module:function checked without importing the module
modelcheck.py  running a MODEL factory and checking what it returns
hardware.py    what the CPU/GPU can do, read without TensorFlow: the precision `auto` picks
devices.py     the first TensorFlow import: memory growth, seeds, precision, distribution strategy
"""
