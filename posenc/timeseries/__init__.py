"""Time-series encodings, model and data from ConvTran (Foumani et al. 2023): tAPE, eRPE (scalar,
after the softmax) and its vector variant, a ConvTran-style classifier, and a reader for the
UEA/UCR ``.ts`` format with the datasets bundled in the sktime wheel."""

from .erpe import ERPE
from .erpe_vector import ERPEVector
from .tape import TAPE

__all__ = ["ERPE", "ERPEVector", "TAPE"]
