"""graphjit's torch code: ``graphs`` (the :class:`~graphjit.backends.base.Backend`), ``dist`` (the
all-reduce swap's view of ``torch.distributed``), ``training`` (``graphed_layer``'s glue) and ``device``
(what torch says about this machine's GPUs).  Nothing here is imported until a torch tensor or option
asks for it (:func:`graphjit.backends.load`)."""
