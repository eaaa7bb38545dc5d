"""The GPU check, `python -m train check`: is a GPU used, and if not, why not and what is the fix.

An optional part. Training never imports it (the run manifest records the driver's GPU list when
it is here, and nothing when it is not). To drop it from a fork, delete this folder, tests/gpucheck/
and its entry in `train.cli.OPTIONAL_COMMANDS` (tasks.py's `gpu-check` task then has nothing to run).

  command.py   the `check` sub-command: its flags, and the call into check.py
  check.py     collect -> diagnose -> report, the verdict and the exit code
  facts.py     what the machine and TensorFlow say (the TensorFlow probe runs in a subprocess)
  gpuinfo.py   what the NVIDIA driver says (NVML or nvidia-smi), without TensorFlow
  tflog.py     TensorFlow's C++ start-up log sorted into what explains a failure and noise
  diagnose.py  pure functions: facts -> a list of diagnoses
  stack.py     TensorFlow's tested CUDA/cuDNN/driver table, checked against the lock files
"""
