"""The parts of ``posenc demo``, one module per modality (see :mod:`posenc.demo`)."""
