"""The parallel package is the only code that creates process groups or calls torch.distributed, and
its DeepSpeed adapter (deepspeed_adapter.py, with deepspeed_zero.py for ZeRO's optimizer) the only code that imports
DeepSpeed or touches its internals."""
from __future__ import annotations

import re
import tokenize

from tests.conftest import REPO

DIST = re.compile(r"\btorch \. distributed\b|\bdist \. \w+ \(|\bnew_group \(")
DEEPSPEED = re.compile(r"\bimport deepspeed\b|\bfrom deepspeed\b")
INTERNALS = {"_local_start", "forward_funcs", "fp16_groups", "fp32_groups", "_hp_mapping", "loss_scale_config",
             "clip_fp32_gradients", "enable_backward_allreduce", "micro_steps", "_grid", "PipelineParallelGrid",
             "PipeDataParallelTopology", "PipelineModule", "LayerSpec", "is_fp16_supported", "bit16_groups",
             "bit16_groups_flat", "single_partition_of_fp32_groups", "_grad_acc_hooks", "update_lp_params"}
PACKAGE = REPO / "trainer" / "parallel"
ADAPTER = PACKAGE / "deepspeed_adapter.py"
ADAPTERS = {ADAPTER, PACKAGE / "deepspeed_zero.py"}
SKIP = {tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENCODING, tokenize.ENDMARKER}


def _sources():
    for top in ("trainer", "launch", "data_prep"):
        yield from sorted((REPO / top).rglob("*.py"))


def _code(path) -> str:
    """The file's code tokens, space-separated: comments, docstrings and strings (prose that merely
    names things) are left out."""
    with open(path, "rb") as f:
        return " ".join(t.string for t in tokenize.tokenize(f.readline) if t.type not in SKIP)


def _internals(path) -> set[str]:
    """Internal names used as identifiers or as a bare string (getattr(x, "_hp_mapping"))."""
    with open(path, "rb") as f:
        words = {t.string.strip("'\"") if t.type == tokenize.STRING else t.string for t in tokenize.tokenize(f.readline)
                 if t.type in (tokenize.NAME, tokenize.STRING)}
    return words & INTERNALS


def test_only_the_runtime_and_p2p_comm_call_torch_distributed():
    allowed = {PACKAGE / "runtime.py", PACKAGE / "comm.py"}
    offenders = [str(p.relative_to(REPO)) for p in _sources() if p not in allowed and DIST.search(_code(p))]
    assert offenders == [], f"torch.distributed used outside trainer/parallel/runtime.py and comm.py: {offenders}"


def test_only_the_adapter_imports_deepspeed_or_touches_its_internals():
    imports = [str(p.relative_to(REPO)) for p in _sources() if p not in ADAPTERS and DEEPSPEED.search(_code(p))]
    assert imports == [], f"DeepSpeed imported outside the adapter: {imports}"
    touches = {str(p.relative_to(REPO)): sorted(_internals(p)) for p in _sources()
               if p not in ADAPTERS and _internals(p)}
    assert touches == {}, f"DeepSpeed internals named outside the adapter: {touches}"


def test_the_grep_finds_what_it_looks_for():
    """The patterns are not vacuous: they match the files that legitimately use them."""
    assert DIST.search(_code(PACKAGE / "runtime.py")) and DEEPSPEED.search(_code(ADAPTER))
    assert _internals(ADAPTER) >= {"_local_start", "forward_funcs", "fp16_groups", "fp32_groups",
                                                      "_hp_mapping", "loss_scale_config", "clip_fp32_gradients",
                                                      "enable_backward_allreduce", "micro_steps"}
    assert _internals(PACKAGE / "deepspeed_zero.py") >= {"bit16_groups_flat", "single_partition_of_fp32_groups",
                                                         "_grad_acc_hooks", "update_lp_params"}


DATA_PREP_IMPORT = re.compile(r"\bfrom data_prep(?: \. (\w+))?(?: \. \w+)* import\b|\bimport data_prep(?: \. (\w+))?")


def test_the_trainer_reads_data_prep_only_through_its_data_format_module():
    """The wall between writer and reader: trainer/ imports data_prep.dataformat and nothing else of
    data_prep; data_prep imports nothing of the trainer."""
    offenders = []
    for path in sorted((REPO / "trainer").rglob("*.py")):
        for m in DATA_PREP_IMPORT.finditer(_code(path)):
            if (m.group(1) or m.group(2)) != "dataformat":
                offenders.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert offenders == [], f"trainer/ imports data_prep beyond data_prep.dataformat: {offenders}"
    back = [str(p.relative_to(REPO)) for p in sorted((REPO / "data_prep").rglob("*.py"))
            if re.search(r"\bfrom trainer\b|\bimport trainer\b", _code(p))]
    assert back == [], f"data_prep imports the trainer: {back}"


def test_the_wall_test_sees_an_import_past_the_data_format_module(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from data_prep.normalize import normalize\nimport data_prep.binary\n"
                   "from data_prep.dataformat import PAD_ID\n")
    found = [m.group(1) or m.group(2) for m in DATA_PREP_IMPORT.finditer(_code(bad))]
    assert found == ["normalize", "binary", "dataformat"]
