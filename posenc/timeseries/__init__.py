"""Time-series encodings from ConvTran: eRPE (tAPE follows with the time-series issue)."""

from .erpe import ERPE

__all__ = ["ERPE"]
