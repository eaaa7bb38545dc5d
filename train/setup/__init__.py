"""Before any training: the settings file, the MODEL spec, the cluster, joining it, the hardware and devices.

envfile.py     the settings file (.env): its values, and a line number for everything wrong in it
modelspec.py   MODEL=package.module:function checked without importing the module
modelcheck.py  running a MODEL factory and checking what it returns
cluster.py     which processes train together (TF_CONFIG or WORKERS + WORKER_INDEX)
join.py        waiting, interruptibly, until every worker has started
hardware.py    what the CPU/GPU can do, read without TensorFlow: the precision `auto` picks
devices.py     the first TensorFlow import: memory growth, seeds, precision, distribution strategy
"""
