"""The parts that encodings of several modalities are built from, outside the attention core:
rotary application (:mod:`.rotary`), sinusoid tables (:mod:`.sinusoid`), stochastic positional
encoding (:mod:`.spe`), tables whose gradient is shared across blocks (:mod:`.shared_table`),
tensors derived from parameters, kept between calls (:mod:`.derived`), and the sizes refused
before a tensor or model too large for the machine is built (:mod:`.budget`).

``primitives`` imports the core (``posenc.common``) and nothing else of posenc; the core never
imports it, and a modality may (docs/architecture.md, "The layers"). The pure functions users call
from their own attention are re-exported by :mod:`posenc.functional`.
"""
