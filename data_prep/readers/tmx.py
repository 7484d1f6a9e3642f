"""TMX (Translation Memory eXchange) 1.4b and 1.1: a streaming reader and a small writer.

The reader feeds the file to expat in 64 KiB pieces, and its handlers keep only what the current <tu> needs
(the chosen <tuv>s' first <seg> text and the <prop>s); text between <tu>s is never stored. So memory stays
constant whatever the file size or its shape, and nothing is recursive. It reads UTF-8 and UTF-16 (expat
follows the byte-order mark and the XML declaration) and gzip (told by its magic bytes, not the name: WIPO
COPPA ships .tmx.gz).

One record per <tu>, origin "file:TU#n" (n counts <tu> elements from 1). The <tuv>s are picked by
`--src-lang/--tgt-lang` from `xml:lang` (1.4) or `lang` (1.1), case-insensitively and with region variants
matched (see `base.lang_matches`): an exact tag first, else the first region variant. A <tu> without one of
the two languages is rejected as "missing_lang" (multilingual memories have many); a chosen <tuv> without
<seg> is "malformed". Inline markup: the native codes of <bpt> <ept> <ph> <it> <ut> are dropped
(`inline="drop"`, default) or kept as text (`inline="text"`); the text of <hi> is always kept. <prop
type="T">V</prop> of the <tu> and of the two chosen <tuv>s become `meta[T] = V` (types lowercased; a repeated
<tu> prop is joined with ";"; <tu> props win over <tuv> props, the source <tuv>'s over the target's). The
document id is the first of `DOC_PROPS` present.

Hostile input (every limit names file and position): entity declarations are refused (no billion laughs, no
external entities, nothing is fetched); a <seg> or <prop> longer than `limits.max_line_bytes`, or a <tu>
holding more than four times that, is rejected as "oversized" without being stored; a <tu> nested deeper than
`MAX_TU_DEPTH` is "malformed"; a document nested deeper than `MAX_DEPTH`, or one XML token (a tag, comment,
attribute) longer than `MAX_TOKEN_BYTES`, stops with an error; a gzipped file that unpacks to more than
`limits.max_expansion` times its size is refused as a likely decompression bomb (base.ExpansionGuard).
"""
from __future__ import annotations

import gzip
import io
import re
import zlib
from contextlib import nullcontext
from typing import IO, BinaryIO, Iterable, Iterator, Optional, Union
from xml.parsers import expat

from .. import files
from .base import (DEFAULT_LIMITS, ExpansionGuard, InputError, InputLimits, Malformed, Pair, PrepareError, Reader,
                   Record, check_lang_pair, lang_matches, lang_tag, looks_utf16)

NS_SEP = "}"  # expat reports "uri}local" for namespaced names
XML_LANG = "http://www.w3.org/XML/1998/namespace" + NS_SEP + "lang"
CODE_TAGS = frozenset({"bpt", "ept", "ph", "it", "ut"})  # native codes; <hi> holds text
DOC_PROPS = ("source-document", "doc", "doc-id", "docid", "document", "family-id", "family_id")
INLINE_MODES = ("drop", "text")
FEED_BYTES = 1 << 16
MAX_TU_DEPTH = 64  # elements inside one <tu>; real inline markup nests a few deep
MAX_DEPTH = 10_000  # the whole document (bounds expat's own stack)
MAX_TOKEN_BYTES = 16 << 20  # bytes expat may take without reporting anything (one huge tag, comment, ...)
MAX_LANGS_SHOWN = 20


def local(tag: str) -> str:
    """The tag without its namespace."""
    return tag[tag.rfind(NS_SEP) + 1:]


def open_binary(path: str, limits: InputLimits = DEFAULT_LIMITS) -> BinaryIO:
    """`path` as bytes, gunzipped (with an `ExpansionGuard`) when it starts with the gzip magic."""
    raw = files.open_read(path, "an input file")
    if raw.read(2) != b"\x1f\x8b":
        raw.seek(0)
        return raw
    raw.seek(0)
    guard = ExpansionGuard(gzip.GzipFile(fileobj=raw, mode="rb"), raw.tell, path, limits, also_close=raw)
    return io.BufferedReader(guard, FEED_BYTES)


def is_gzip(path: str) -> bool:
    with files.open_read(path, "an input file") as f:
        return f.read(2) == b"\x1f\x8b"


def head_bytes(path: str, n: int = 512) -> bytes:
    """The first `n` (decompressed) bytes of `path`, b"" if they cannot be read."""
    try:
        with open_binary(path) as f:
            return f.read(n)
    except (OSError, EOFError, zlib.error, InputError):
        return b""


class _Tuv:
    __slots__ = ("lang", "props", "seg")

    def __init__(self, lang: str):
        self.lang = lang
        self.props: dict[str, str] = {}
        self.seg: Optional[list[str]] = None  # its first <seg>'s text (one piece when done); None: no <seg>


class _Tu:
    __slots__ = ("number", "depth", "props", "langs", "n_tuvs", "chosen", "exact", "stored", "problem")

    def __init__(self, number: int, depth: int):
        self.number, self.depth = number, depth  # depth: of the <tu> element
        self.props: dict[str, str] = {}
        self.langs: list[str] = []  # the first MAX_LANGS_SHOWN, for messages
        self.n_tuvs = 0
        self.chosen: dict[str, Optional[_Tuv]] = {"src": None, "tgt": None}
        self.exact = {"src": False, "tgt": False}
        self.stored = 0  # bytes of text kept for this <tu>
        self.problem: Optional[tuple[str, str]] = None  # (reason, message)


class _TmxHandlers:
    """expat callbacks: the state of the <tu> being read, and the records of finished ones (`ready`)."""

    def __init__(self, reader: "TmxReader", parser):
        self.reader, self.parser, self.path = reader, parser, reader.src_path
        self.cap = reader.limits.max_line_bytes
        self.keep_codes = reader.inline == "text"
        self.depth, self.n, self.seen_root = 0, 0, False
        self.tu: Optional[_Tu] = None
        self.tuv: Optional[_Tuv] = None  # the <tuv> being read, if it is a candidate for a side
        self.tuv_depth = 0
        self.text: Optional[list[str]] = None  # where character data goes now (None: nowhere)
        self.text_bytes = 0
        self.text_depth = 0  # the element whose text is being collected (a <prop> or <seg>)
        self.text_target: tuple = ()
        self.dropped: list[bool] = []  # inside the <seg> being collected: is this element's text dropped?
        self.ready: list[Record] = []
        self.fed_since_event = 0

    # -- expat callbacks --
    def start(self, name: str, attrs: dict) -> None:
        self.fed_since_event = 0
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InputError(f"{self.where()}: elements nested more than {MAX_DEPTH} deep")
        tag = local(name)
        if not self.seen_root:
            self.seen_root = True
            if tag != "tmx":
                raise InputError(f"{self.path}:1: not a TMX file: the root element is <{tag}>, not <tmx>")
            return
        tu = self.tu
        if tu is None:
            if tag == "tu":
                self.n += 1
                self.tu = _Tu(self.n, self.depth)
            return
        if tu.problem:
            return
        if self.depth - tu.depth > MAX_TU_DEPTH:
            self.stop_text()
            tu.problem = ("malformed", f"elements nested more than {MAX_TU_DEPTH} deep inside the <tu>")
            return
        if self.text is not None:  # inside a <seg> or <prop> being collected
            if self.text_target[0] == "prop":
                self.stop_text()  # a <prop>'s value is its text before any child element
            else:
                self.dropped.append(self.dropped[-1] or (not self.keep_codes and tag in CODE_TAGS))
            return
        level = self.depth - tu.depth
        if level == 1 and tag == "prop":
            self.start_text(("prop", tu.props, attrs.get("type", "")))
        elif level == 1 and tag == "tuv":
            self.start_tuv(tu, attrs.get(XML_LANG) or attrs.get("lang") or "")
        elif level == 2 and self.tuv is not None and self.depth == self.tuv_depth + 1:
            if tag == "prop":
                self.start_text(("prop", self.tuv.props, attrs.get("type", "")))
            elif tag == "seg" and self.tuv.seg is None:
                self.tuv.seg = []
                self.dropped = [False]
                self.start_text(("seg", self.tuv))

    def end(self, name: str) -> None:
        self.fed_since_event = 0
        tu = self.tu
        if tu is not None and self.depth == tu.depth:
            self.ready.append(self.record(tu))
            self.tu = self.tuv = None
            self.text = None
        elif tu is not None and not tu.problem:
            if self.text is not None and self.depth == self.text_depth:
                self.finish_text()
            elif self.text is not None and self.text_target[0] == "seg":
                self.dropped.pop()
            elif self.tuv is not None and self.depth == self.tuv_depth:
                self.tuv = None
        self.depth -= 1

    def data(self, text: str) -> None:
        self.fed_since_event = 0
        if self.text is None or (self.text_target[0] == "seg" and self.dropped[-1]):
            return
        size = len(text.encode("utf-8"))
        self.text_bytes += size
        self.tu.stored += size
        if self.text_bytes > self.cap or self.tu.stored > 4 * self.cap:
            what = "<seg>" if self.text_target[0] == "seg" else "<prop>"
            self.tu.problem = ("oversized", f"a {what} or <tu> longer than --max-line-bytes {self.cap}")
            self.stop_text()
            return
        self.text.append(text)

    def refuse_entity(self, name, *_) -> None:
        raise InputError(f"{self.where()}: bad XML: entity declaration <!ENTITY {name} ...>: entities are not "
                         f"accepted in TMX input (they serve entity-expansion bombs and external file reads)")

    # -- helpers --
    def start_tuv(self, tu: _Tu, lang: str) -> None:
        tu.n_tuvs += 1
        if len(tu.langs) < MAX_LANGS_SHOWN:
            tu.langs.append(lang or "?")
        tuv = _Tuv(lang)
        candidate = False
        for side, wanted in (("src", self.reader.src_lang), ("tgt", self.reader.tgt_lang)):
            exact = lang_tag(lang) == lang_tag(wanted)
            if (exact and not tu.exact[side]) or (tu.chosen[side] is None and lang_matches(lang, wanted)):
                tu.chosen[side], tu.exact[side], candidate = tuv, exact, True
        self.tuv, self.tuv_depth = (tuv, self.depth) if candidate else (None, 0)

    def start_text(self, target: tuple) -> None:
        self.text, self.text_bytes, self.text_depth, self.text_target = [], 0, self.depth, target
        if target[0] == "prop":
            self.tu.stored += len(target[2])

    def finish_text(self) -> None:
        target, text = self.text_target, "".join(self.text)
        if target[0] == "prop":
            props, key, value = target[1], target[2].strip().lower(), text.strip()
            props[key] = f"{props[key]};{value}" if key in props else value
        else:
            target[1].seg = [text]
        self.text = None

    def stop_text(self) -> None:
        if self.text is not None and self.text_target[0] == "prop":
            self.finish_text()
        self.text = None

    def where(self) -> str:
        return f"{self.path}:{self.parser.CurrentLineNumber}:{self.parser.CurrentColumnNumber + 1}"

    def record(self, tu: _Tu) -> Record:
        origin = f"{self.path}:TU#{tu.number}"
        if tu.problem:
            return Malformed(tu.problem[0], origin, tu.problem[1])
        meta = dict(tu.props)
        text: dict[str, str] = {}
        for side, tuv in tu.chosen.items():
            if tuv is None:
                continue
            if tuv.seg is None:
                return Malformed("malformed", origin, f"<tuv> {tuv.lang!r} has no <seg>")
            text[side] = "".join(tuv.seg)
            for key, value in tuv.props.items():
                meta.setdefault(key, value)
        if len(text) < 2:
            missing = self.reader.src_lang if tu.chosen["src"] is None else self.reader.tgt_lang
            langs = ", ".join(tu.langs) + (", ..." if tu.n_tuvs > len(tu.langs) else "") or "none"
            return Malformed("missing_lang", origin, f"no <tuv> for {missing!r} (languages: {langs})",
                             text.get("src", ""), text.get("tgt", ""))
        doc = next((meta[k] for k in DOC_PROPS if meta.get(k)), None)
        return Pair(text["src"], text["tgt"], origin, doc=doc, meta=meta or None)


class TmxReader(Reader):
    """TMX 1.4b / 1.1, plain or gzipped, UTF-8 or UTF-16 with BOM (see the module docstring)."""

    name = "tmx"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_lang_pair(self.src_lang, self.tgt_lang)
        if self.inline not in INLINE_MODES:
            raise PrepareError(f"TMX inline markup: {self.inline!r} is not one of {', '.join(INLINE_MODES)}")

    def records(self) -> Iterator[Record]:
        path = self.src_path
        parser = expat.ParserCreate(namespace_separator=NS_SEP)
        handlers = _TmxHandlers(self, parser)
        parser.buffer_text = True  # adjacent text in one callback, gathered by expat up to buffer_size only
        parser.buffer_size = FEED_BYTES
        parser.StartElementHandler, parser.EndElementHandler = handlers.start, handlers.end
        parser.CharacterDataHandler = handlers.data
        parser.EntityDeclHandler = handlers.refuse_entity
        try:
            with open_binary(path, self.limits) as f:
                while chunk := f.read(FEED_BYTES):
                    handlers.fed_since_event += len(chunk)
                    if handlers.fed_since_event > MAX_TOKEN_BYTES:
                        raise InputError(f"{handlers.where()}: more than {MAX_TOKEN_BYTES} bytes without an element "
                                         f"or text (one huge tag, comment or declaration?)")
                    parser.Parse(chunk, False)
                    yield from handlers.ready
                    handlers.ready.clear()
                parser.Parse(b"", True)
                yield from handlers.ready
        except expat.ExpatError as e:
            raise self.xml_error(e) from None
        except EOFError:
            raise InputError(f"{path}: truncated gzip file: the compressed data ends early (after TU #{handlers.n})"
                             ) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise InputError(f"{path}: corrupt gzip data after TU #{handlers.n}: {e}") from None

    def xml_error(self, e: expat.ExpatError) -> InputError:
        line, col = e.lineno, e.offset
        message = str(e).rsplit(": line ", 1)[0]
        where = " (of the decompressed text)" if is_gzip(self.src_path) else ""
        utf16 = looks_utf16(head_bytes(self.src_path))
        if utf16 == "without BOM":
            message += ("; the file looks like UTF-16 without a byte-order mark, read with the encoding its XML "
                        "declaration names: save it as UTF-16 with a BOM, or as UTF-8")
        return InputError(f"{self.src_path}:{line}:{col + 1}: bad XML{where}: {message}")


# --- writing ----------------------------------------------------------------------------------------------------

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_escape(text: str, attribute: bool = False) -> str:
    """Escape for XML 1.0 element content (or a double-quoted attribute); "\\r" as a reference so it survives."""
    bad = _NOT_XML.search(text)
    if bad:
        raise ValueError(f"U+{ord(bad.group()):04X} cannot be written in XML 1.0: {text!r}")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")
    if attribute:
        text = text.replace('"', "&quot;").replace("\t", "&#9;").replace("\n", "&#10;")
    return text


PairLike = Union[Pair, tuple]


def write_tmx(path: str, pairs: Iterable[PairLike], src_lang: str = "en", tgt_lang: str = "ja", *,
              version: str = "1.4", encoding: str = "utf-8", gzipped: Optional[bool] = None) -> int:
    """Write `pairs` (`Pair`s or (src, tgt[, props]) tuples) as a TMX file; returns the number of <tu>s.

    A `Pair`'s meta become <tu> <prop>s (its doc a "source-document" prop unless meta has one). `version` "1.1"
    writes `lang=` instead of `xml:lang=`; `encoding` "utf-16" writes a byte-order mark; `gzipped` defaults to
    whether `path` ends in ".gz". Text is written exactly (nothing stripped): `TmxReader` reads it back.
    """
    gzipped = path.endswith(".gz") if gzipped is None else gzipped
    with files.replace(path, "the TMX file", binary=True) as raw:
        with (gzip.GzipFile(fileobj=raw, mode="wb") if gzipped else nullcontext(raw)) as packed:
            out = io.TextIOWrapper(packed, encoding=encoding, newline="\n")
            try:
                n = _write_tus(out, pairs, src_lang, tgt_lang, version, encoding)
                out.flush()
            finally:
                out.detach()  # the file itself is the file layer's to close
    return n


def _write_tus(out: IO[str], pairs: Iterable[PairLike], src_lang: str, tgt_lang: str, version: str,
               encoding: str) -> int:
    lang_attr = "lang" if version == "1.1" else "xml:lang"
    n = 0
    out.write(f'<?xml version="1.0" encoding="{encoding.upper()}"?>\n<tmx version="{version}">\n'
              f'  <header creationtool="hybrid-nmt data_prep" creationtoolversion="1" datatype="plaintext" '
              f'segtype="sentence" adminlang="en" srclang="{xml_escape(src_lang, True)}" o-tmf="none"/>\n'
              f'  <body>\n')
    for item in pairs:
        if isinstance(item, Pair):
            src, tgt, meta = item.src, item.tgt, dict(item.meta or {})
            if item.doc is not None and not any(k in meta for k in DOC_PROPS):
                meta["source-document"] = item.doc
        else:
            src, tgt, meta = item[0], item[1], dict(item[2]) if len(item) > 2 else {}
        n += 1
        out.write(f'    <tu tuid="{n}">\n')
        for key, value in meta.items():
            out.write(f'      <prop type="{xml_escape(key, True)}">{xml_escape(str(value))}</prop>\n')
        for lang, text in ((src_lang, src), (tgt_lang, tgt)):
            out.write(f'      <tuv {lang_attr}="{xml_escape(lang, True)}"><seg>{xml_escape(text)}</seg></tuv>\n')
        out.write("    </tu>\n")
    out.write("  </body>\n</tmx>\n")
    return n
