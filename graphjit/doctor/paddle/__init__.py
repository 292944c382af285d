"""The doctor's Paddle half: ``rows`` (the Paddle section), ``probe`` (the capture probe process) and
``allreduce`` (the ``--collectives`` probe process)."""
