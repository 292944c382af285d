"""graphjit's Paddle code: ``graphs`` (the :class:`~graphjit.backends.base.Backend`), ``dist`` (the
all-reduce swap's view of ``paddle.distributed``), ``training`` (``graphed_layer``'s glue) and ``device``
(what Paddle says about this machine's GPUs, and tensors to numpy).  Nothing here is imported until a
Paddle tensor or option asks for it (:func:`graphjit.backends.load`)."""
