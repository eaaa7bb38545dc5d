import gc
import sys

from .cli import main

code = main()
# Python's shutdown would now garbage-collect every object TensorFlow made, half a second after a
# run for nothing: every command has written and closed its files by the time it returns.
gc.freeze()
sys.exit(code)
