"""Read an offline wandb run's records back (tests only): the .wandb file is a LevelDB-style log of
protobuf `Record`s (a 7-byte ':W&B' header, then 32 KiB blocks of records with a 7-byte header each:
crc32c, little-endian length, type FULL/FIRST/MIDDLE/LAST)."""
from __future__ import annotations

import struct

BLOCK = 32768
HEADER = 7


def records(path: str):
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path}: not a wandb run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def summary(path: str) -> dict:
    """{'config': {key: json text}, 'history': [{key: json text}], 'files': [...]} of a run file."""
    out = {"config": {}, "history": [], "files": []}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["config"].update({item.key: item.value_json for item in r.run.config.update})
        elif kind == "config":
            out["config"].update({item.key: item.value_json for item in r.config.update})
        elif kind == "history":  # nested keys joined with '.': 'dev_samples._type'
            out["history"].append({item.key or ".".join(item.nested_key): item.value_json for item in r.history.item})
        elif kind == "files":
            out["files"] += [f.path for f in r.files.files]
    return out
