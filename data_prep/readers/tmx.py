"""TMX (Translation Memory eXchange) 1.4b and 1.1: a streaming reader and a small writer.

The reader parses with `xml.etree.ElementTree.iterparse` and drops every <tu> once it is turned into a record,
so memory stays constant whatever the file size. It reads UTF-8 and UTF-16 (expat follows the byte-order mark
and the XML declaration) and gzip (told by its magic bytes, not the name: WIPO COPPA ships .tmx.gz).

One record per <tu>, origin "file:TU#n" (n counts <tu> elements from 1). The <tuv>s are picked by
`--src-lang/--tgt-lang` from `xml:lang` (1.4) or `lang` (1.1), case-insensitively and with region variants
matched (see `base.lang_matches`). A <tu> without one of the two languages is rejected as "missing_lang"
(multilingual memories have many); a <tuv> without <seg> is "malformed". Inline markup: the native codes of
<bpt> <ept> <ph> <it> <ut> are dropped (`inline="drop"`, default) or kept as text (`inline="text"`); the
text of <hi> is always kept. <prop type="T">V</prop> of the <tu> and of the two chosen <tuv>s become
`meta[T] = V` (types lowercased; a repeated <tu> prop is joined with ";"; <tu> props win over <tuv> props,
the source <tuv>'s over the target's). The document id is the first of `DOC_PROPS` present.
"""
from __future__ import annotations

import gzip
import re
import xml.etree.ElementTree as ET
import zlib
from typing import IO, BinaryIO, Iterable, Iterator, Optional, Union

from .base import InputError, Malformed, Pair, PrepareError, Reader, Record, check_lang_pair, lang_matches, lang_tag
from .base import looks_utf16

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
CODE_TAGS = frozenset({"bpt", "ept", "ph", "it", "ut"})  # native codes; <hi> holds text
DOC_PROPS = ("source-document", "doc", "doc-id", "docid", "document", "family-id", "family_id")
INLINE_MODES = ("drop", "text")


def local(tag: str) -> str:
    """The tag without its namespace (the parser drops comments and PIs, so tags are strings)."""
    return tag[tag.rfind("}") + 1:]


def open_binary(path: str) -> BinaryIO:
    """`path` as bytes, gunzipped when it starts with the gzip magic."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def head_bytes(path: str, n: int = 512) -> bytes:
    """The first `n` (decompressed) bytes of `path`, b"" if they cannot be read."""
    try:
        with open_binary(path) as f:
            return f.read(n)
    except (OSError, EOFError, zlib.error):
        return b""


def seg_text(elem: ET.Element, keep_codes: bool) -> str:
    if not len(elem):
        return elem.text or ""
    parts = [elem.text or ""]
    for child in elem:
        if keep_codes or local(child.tag) not in CODE_TAGS:
            parts.append(seg_text(child, keep_codes))
        parts.append(child.tail or "")
    return "".join(parts)


def tuv_lang(tuv: ET.Element) -> str:
    return tuv.get(XML_LANG) or tuv.get("lang") or ""


def pick_tuv(tuvs: list[ET.Element], wanted: str) -> Optional[ET.Element]:
    """The <tuv> of language `wanted`: an exact tag match first, else the first region variant."""
    exact = next((t for t in tuvs if lang_tag(tuv_lang(t)) == lang_tag(wanted)), None)
    return exact if exact is not None else next((t for t in tuvs if lang_matches(tuv_lang(t), wanted)), None)


def children(elem: ET.Element, *tags: str) -> tuple[dict[str, str], list[list[ET.Element]]]:
    """(the <prop>s of `elem` as {type: value}, its children of each of `tags`), in one pass."""
    props: dict[str, str] = {}
    found: list[list[ET.Element]] = [[] for _ in tags]
    for child in elem:
        tag = local(child.tag)
        if tag == "prop":
            key, value = child.get("type", "").strip().lower(), (child.text or "").strip()
            props[key] = f"{props[key]};{value}" if key in props else value
        elif tag in tags:
            found[tags.index(tag)].append(child)
    return props, found


class TmxReader(Reader):
    """TMX 1.4b / 1.1, plain or gzipped, UTF-8 or UTF-16 with BOM (see the module docstring)."""

    name = "tmx"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_lang_pair(self.src_lang, self.tgt_lang)
        if self.inline not in INLINE_MODES:
            raise PrepareError(f"TMX inline markup: {self.inline!r} is not one of {', '.join(INLINE_MODES)}")

    def records(self) -> Iterator[Record]:
        path, n = self.src_path, 0
        try:
            with open_binary(path) as f:
                root = body = None
                for event, elem in ET.iterparse(f, events=("start", "end")):
                    tag = elem.tag
                    if event == "start":
                        if root is None:
                            root = elem
                            if local(tag) != "tmx":
                                raise InputError(f"{path}:1: not a TMX file: the root element is <{local(tag)}>, "
                                                 f"not <tmx>")
                        elif body is None and local(tag) == "body":
                            body = elem
                    elif tag == "tu" or tag.endswith("}tu"):
                        n += 1
                        yield self.record(elem, f"{path}:TU#{n}")
                        elem.clear()
                        (body if body is not None else root).clear()  # the parser holds no other reference
        except ET.ParseError as e:
            raise self.xml_error(e) from None
        except EOFError:
            raise InputError(f"{path}: truncated gzip file: the compressed data ends early (after TU #{n})") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise InputError(f"{path}: corrupt gzip data after TU #{n}: {e}") from None

    def xml_error(self, e: ET.ParseError) -> InputError:
        line, col = e.position
        message = str(e).rsplit(": line ", 1)[0]
        where = " (of the decompressed text)" if is_gzip(self.src_path) else ""
        utf16 = looks_utf16(head_bytes(self.src_path))
        if utf16 == "without BOM":
            message += ("; the file looks like UTF-16 without a byte-order mark, read with the encoding its XML "
                        "declaration names: save it as UTF-16 with a BOM, or as UTF-8")
        return InputError(f"{self.src_path}:{line}:{col + 1}: bad XML{where}: {message}")

    def record(self, tu: ET.Element, origin: str) -> Record:
        meta, (tuvs,) = children(tu, "tuv")
        chosen = {"src": pick_tuv(tuvs, self.src_lang), "tgt": pick_tuv(tuvs, self.tgt_lang)}
        text: dict[str, str] = {}
        for side, tuv in chosen.items():
            if tuv is None:
                continue
            tuv_props, (segs,) = children(tuv, "seg")
            if not segs:
                return Malformed("malformed", origin, f"<tuv> {tuv_lang(tuv)!r} has no <seg>")
            text[side] = seg_text(segs[0], keep_codes=self.inline == "text")
            for key, value in tuv_props.items():
                meta.setdefault(key, value)
        if len(text) < 2:
            missing = self.src_lang if chosen["src"] is None else self.tgt_lang
            langs = ", ".join(tuv_lang(t) or "?" for t in tuvs) or "none"
            return Malformed("missing_lang", origin, f"no <tuv> for {missing!r} (languages: {langs})",
                             text.get("src", ""), text.get("tgt", ""))
        doc = next((meta[k] for k in DOC_PROPS if meta.get(k)), None)
        return Pair(text["src"], text["tgt"], origin, doc=doc, meta=meta or None)


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
    lang_attr = "lang" if version == "1.1" else "xml:lang"
    gzipped = path.endswith(".gz") if gzipped is None else gzipped
    opener = gzip.open if gzipped else open
    n = 0
    with opener(path, "wt", encoding=encoding, newline="\n") as f:
        out: IO[str] = f
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
