"""Bridges that run posenc's encodings inside other libraries' models.

One module per library, each imported only on demand (``import posenc`` never loads them):

* :mod:`posenc.integrations.attention_smithy`: AttentionSmithy strategies and an attention method
  (extra ``smithy``).
* :mod:`posenc.integrations.transformers`: Hugging Face transformers' attention interface and a
  one-call encoding swap (extra ``hf``).

Each module imports its library through :func:`posenc.training.report.optional` at import time, so a
missing library is one ``MissingExtra`` line naming the extra that installs it. Integrations sit above
the modalities and beside the command line: they may import any modality, and nothing in the library
imports them.
"""
