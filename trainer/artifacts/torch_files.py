"""torch.load of a file a user handed over (a checkpoint's tensors, an exported model): weights only, never code, and
what goes wrong said in one line. torch's own words for a refused file run to a dozen lines (the 2.6 change of
`weights_only`'s default, the advice to turn it off, a link) and come with a UserWarning about the pickle protocol
printed before them; the entry points' contract is one line on stderr (trainer.entry.fail)."""
from __future__ import annotations

import pickle
import warnings

import torch

from data_prep.dataformat import files

REASON_CHARS = 300  # the reason kept from torch's message


def load_weights(f):
    """torch.load(f, weights_only=True) on the CPU, torch's warnings about the file's pickle kept quiet (the file is
    refused or read either way); raises UnreadableTorchFile with `reason(e)` on anything torch cannot or will not read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*pickle protocol", category=UserWarning)
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except (FileNotFoundError, files.FileError):  # the caller's "missing", the file layer's own one-line refusals
            raise
        except Exception as e:  # truncated zip, bad pickle, a global the weights-only unpickler refuses, ...
            raise UnreadableTorchFile(reason(e)) from None


class UnreadableTorchFile(ValueError):
    """A file torch.load(weights_only=True) cannot or will not read; str() is one line."""


def reason(e: BaseException) -> str:
    """One line for why torch refused a file: for the weights-only unpickler the line that names what the file asked
    for (an unsupported global: code it would have run), else the first line of the message; its type in front."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    asked = [line for line in lines if line.startswith(("Trying to load unsupported", "Unsupported global"))]
    said = [line for line in lines if line.startswith("Unsupported operand")]  # bytes that are no pickle it reads
    text = (asked or said or lines or [""])[0]
    if isinstance(e, pickle.UnpicklingError) and asked:
        text = f"refused by the weights-only loader: {text}"
    text = text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
