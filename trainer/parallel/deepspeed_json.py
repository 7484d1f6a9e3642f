"""The DeepSpeed JSON as a run reads it: trainer.ds_config's checks (types, ranges, what the schedule supports),
then what only DeepSpeed itself can say (trainer.parallel.deepspeed_adapter: the optimizers and schedulers it
knows, those it tests ZeRO with, the keys its own reader reads), then the schedule's length from the YAML.

trainer.ds_config knows nothing of parallel; this module is where the JSON meets DeepSpeed and the layout.
"""
from __future__ import annotations

import json

from trainer.ds_config import MAX_BYTES, DSConfigError, bf16_auto, complete_schedule, read_json_file, validate, with_bf16
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.layout import SECTION


def load_ds_config(path: str, max_steps: int | None, where: str = "train.max_steps") -> dict:
    """The DeepSpeed JSON, checked. The length of a WarmupDecayLR / WarmupCosineLR schedule comes from the
    YAML (`max_steps`: train.schedule_steps or train.max_steps, named by `where`), never from two places: a
    `total_num_steps` stated in the JSON is refused unless it is the same number. `max_steps=None` reads the
    JSON without completing it."""
    ds = read_json_file(path, flag="--deepspeed_config", kind="a DeepSpeed JSON", max_bytes=MAX_BYTES,
                        error=DSConfigError)
    validate(ds, path)
    check_with_deepspeed(ds, path)
    return complete_schedule(ds, path, max_steps, where)


def check_with_deepspeed(ds: dict, path: str) -> None:
    """What DeepSpeed's own lists say of a JSON trainer.ds_config.validate passed: the optimizer and scheduler
    are ones it knows, ZeRO's optimizer one it tests, and every key one it reads."""
    for name in ("optimizer", "scheduler"):
        sec = ds.get(name) or {}
        if not sec:
            continue
        known = dsa.optimizer_names() if name == "optimizer" else dsa.scheduler_names()
        if sec["type"] not in known and not (name == "optimizer" and sec["type"].lower() in known):
            raise DSConfigError(f"{path}: {name}.type={json.dumps(sec['type'])}: not {'an' if name == 'optimizer' else 'a'} "
                                f"{name} DeepSpeed knows "
                                f"(e.g. {', '.join(dsa.PREFERRED[name])})")
    _check_zero_optimizer(ds, path)
    _check_known_keys(ds, path)


def _check_zero_optimizer(ds: dict, path: str) -> None:
    """ZeRO stage 1 with an optimizer DeepSpeed tests it with, unless the JSON says it knows better."""
    if ds.get("zero_optimization", {}).get("stage", 0) != 1:
        return
    opt_type = (ds.get("optimizer") or {}).get("type")
    if opt_type and not ds.get("zero_allow_untested_optimizer"):
        tested = dsa.zero_optimizer_names()
        if opt_type.lower() not in tested:
            raise DSConfigError(f"{path}: zero_optimization.stage=1 with optimizer.type={json.dumps(opt_type)}: "
                                f"DeepSpeed tests ZeRO with {', '.join(sorted(tested))} only; use one of them, or set "
                                f"\"zero_allow_untested_optimizer\": true")


def _check_known_keys(ds: dict, path: str) -> None:
    """Every key is one DeepSpeed reads (or our own parallel_layout): DeepSpeed ignores a top-level key it does
    not know, so `gradient_clіpping` spelt with a Cyrillic і trained with clipping off and no word. DeepSpeed's
    own reader, run on the JSON, says which keys it reads (trainer.parallel.deepspeed_adapter.unread_keys); a
    key it would ignore, or refuse only once the model is built, is refused here in one line."""
    for unread in dsa.unread_keys(with_bf16(ds, True) if bf16_auto(ds) else ds):  # "auto": true or false at launch
        if unread.key == SECTION:
            continue
        hint = _spelling(unread.key.rpartition(".")[2], unread.known)
        if unread.refused:
            raise DSConfigError(f"{path}: {unread.key}: DeepSpeed refuses it: {unread.refused}{hint}")
        raise DSConfigError(f"{path}: {unread.key}: not a key DeepSpeed reads there{hint}; refused (DeepSpeed would "
                            f"ignore it, or fail on it once the model is built): remove it, or spell it as DeepSpeed "
                            f"does")


def _spelling(key: str, known: tuple) -> str:
    """What may be wrong with the name `key`: a letter that only looks ASCII, the closest name DeepSpeed knows."""
    import difflib
    import unicodedata

    odd = [f"'{c}' U+{ord(c):04X} {unicodedata.name(c, '')}".rstrip() for c in dict.fromkeys(key) if ord(c) > 127]
    close = difflib.get_close_matches(key, [k for k in known if k != key], n=1, cutoff=0.8)
    parts = ([f"did you mean {close[0]}?"] if close else []) + ([f"it holds {', '.join(odd)}"] if odd else [])
    return f" ({' '.join(parts)})" if parts else ""
