"""The doctor's torch half: ``rows`` (the torch section), ``ipc`` (the CUDA IPC probe process) and
``allreduce`` (the ``--collectives`` probe process)."""
