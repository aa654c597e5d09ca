"""Time-series encodings: tAPE and eRPE (ConvTran)."""

from .erpe import ERPE

__all__ = ["ERPE"]
