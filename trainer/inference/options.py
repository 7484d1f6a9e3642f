"""How to decode: the settings of a Translator, checked once, when they are made.

`DecodeOptions.from_config(decode_cfg, beam=..., ...)`: the config's decode section (the run's, or the exported
model's) with the flags the user gave (None: the config's). An option that cannot work is a ValueError naming its
flag, before any line is read; a Translator holds one and never checks it again.
"""
from __future__ import annotations

import dataclasses
import math

from trainer.config import DECODE_LIMITS

FLAGS = {"beam": "--beam", "batch_size": "--batch-size", "max_tokens": "--max-tokens", "max_len_ratio": "--max-len-ratio",
         "max_len_add": "decode.max_len_add"}  # the name a value is refused by (max_len_add has no flag)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    beam: int  # 1 = greedy
    max_len_ratio: float  # longest hypothesis = source pieces x this + max_len_add
    max_len_add: int
    length_penalty: float  # rank by log-prob / length^this
    batch_size: int  # sentences per batch
    max_tokens: int  # padded source pieces per batch (0: no cap)
    max_line_bytes: int  # a longer input line is not translated (0: no cap)

    def __post_init__(self):
        if self.beam < 1:
            raise ValueError(f"--beam {self.beam}: the beam size must be >= 1 (1 = greedy)")
        if not (math.isfinite(self.max_len_ratio) and self.max_len_ratio > 0):  # nan/inf/negative: every hypothesis empty
            raise ValueError(f"--max-len-ratio {self.max_len_ratio}: must be a finite number > 0 (longest hypothesis "
                             f"= source pieces x ratio + {self.max_len_add})")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"--length-penalty {self.length_penalty}: must be a finite number")
        for flag, value, least in (("--batch-size", self.batch_size, 1), ("--max-tokens", self.max_tokens, 0)):
            if value < least:
                raise ValueError(f"{flag} {value}: must be >= {least}")
        if self.max_line_bytes < 0:
            raise ValueError(f"--max-line-bytes {self.max_line_bytes}: must be >= 0 (0 = no cap)")
        for name, flag in FLAGS.items():  # a size is bounded before it becomes an allocation
            if getattr(self, name) > DECODE_LIMITS[name]:
                raise ValueError(f"{flag} {getattr(self, name)}: at most {DECODE_LIMITS[name]} (larger sizes only ask "
                                 f"for memory; decoding gains nothing from them)")

    @classmethod
    def from_config(cls, decode_cfg, **flags) -> "DecodeOptions":
        """`decode_cfg` (trainer.config.DecodeConfig) with the `flags` that are not None."""
        values = {f.name: getattr(decode_cfg, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**values, **{k: v for k, v in flags.items() if v is not None}})

    def with_flags(self, **flags) -> "DecodeOptions":
        """These options with the `flags` that are not None (checked like any DecodeOptions)."""
        given = {k: v for k, v in flags.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self
