"""Text normalisation shared by `data_prep.prepare` and the trainer's translation input.

The manifest records the flags (`manifest["normalize"]`, the source side's); whoever feeds text to a model
trained on that data calls `normalize(text, **manifest["normalize"])` so both see the same strings.
SentencePiece is trained with its own normalisation switched off (`normalization_rule_name="identity"`),
so this function is the only one that rewrites text and `decode(encode(normalize(x))) == normalize(x)` for
text without unknown characters. Every flag defaults to off (the behaviour of manifests written before the
flag existed); `prepare` switches the safe ones on (see its --help).

Steps, in this order (`repair` reports which of them changed the text):

1. `entities`: HTML/XML character references (`&#945;`, `&#x3b1;`) and named ones (`&amp;`, `&lt;`,
   `&nbsp;`, any HTML5 name) are unescaped -- only with their closing ";", so "R&D" or "&para" in plain
   text stay. A double-escaped reference (`&amp;lt;`, an XML export of already escaped text) is unescaped
   a second time ("double_escaped"): the text under the second level is fine, and rejecting such pairs
   would lose them for an artefact of the export. A third level is left alone (never seen, and "&amp;lt;"
   may then be meant literally).
2. `markup`: patent XML left in the text. Formula-like elements -- MathML `<math>`, `<maths>`, chemistry
   `<chem>`/`<chemistry>`, `<in-line-formulae>`, tables and `<img .../>` -- are replaced, content and all,
   by the placeholder `PLACEHOLDER` ("⟨formula⟩": NFKC- and case-stable, never produced by text, and a
   user-defined SentencePiece symbol, so it is always one piece and never <unk>). Inline formatting
   (`<sub>`, `<sup>`, `<i>`, `<b>`, `<u>`, `<o>`, `<smallcaps>`, `<figref>`, ...) loses its tags and keeps
   its text ("H<sub>2</sub>O" -> "H2O"); `<br/>`/`<p>` become a space. Only these names, with well-formed
   attributes, count as tags, so "if a<b and c>d" is text.
3. `nfkc`: Unicode NFKC (full-width digits, letters and brackets -> ASCII, half-width katakana ->
   full-width, "㎜" -> "mm"). Off by default in `prepare`: it also turns "m²" into "m2" and "①" into "1",
   and it changes target text that is scored against raw references.
4. `lowercase`.
5. always: C0/C1 control characters, DEL, the BOM, surrogates and noncharacters (U+FFFE, U+FFFF,
   U+FDD0-FDEF, ...; what XML 1.0 forbids) are deleted ("controls"); every Unicode whitespace character --
   including the line breakers U+2028, U+2029, U+0085, VT and FF, which naive line splitting would
   honour -- becomes a space; runs of spaces become one; the ends are stripped. The result never holds a
   tab or a line break.
6. `cjk_spaces` ("keep" | "collapse" | "auto"): a space between two CJK characters (Han, kana, CJK and
   full-width punctuation; not full-width letters or digits, where "Ｆ０ ＸＹ" means two tokens) is
   removed. `prepare` sets it per side: "keep" unless the side's language is ja or zh. "auto" collapses
   only text that does not look pre-tokenized (fewer than one space per 4 other characters):
   small_parallel_enja's Japanese is word-segmented with spaces, and models trained on it rely on that,
   while a stray space in running patent text ("頭 部１９") is a defect.
"""
from __future__ import annotations

import html
import re
import unicodedata
from html.entities import html5
from typing import Optional

PLACEHOLDER = "⟨formula⟩"

# C0/C1 control characters and DEL are deleted, except the ones Python counts as whitespace (tab, line
# breaks, ...), which become spaces so that words never fuse. Also deleted: the byte-order mark U+FEFF
# (often left at the start of files), surrogates (only reachable through "surrogateescape"/"surrogatepass"
# decoding or character references) and the noncharacters, all of which XML 1.0 forbids.
_NONCHARACTERS = (*range(0xFDD0, 0xFDF0), *(plane + low for plane in range(0, 0x110000, 0x10000)
                                          for low in (0xFFFE, 0xFFFF)))
_DELETE = {c: None for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0xFEFF, *range(0xD800, 0xE000),
                             *_NONCHARACTERS) if not chr(c).isspace()}


def _char_class(codes: set[int]) -> str:
    """A regex character class of these code points, as ranges (a class of 2,000 single characters is slow)."""
    ranges: list[list[int]] = []
    for c in sorted(codes):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


_DELETE_RE = re.compile(_char_class(set(_DELETE)))
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")

_ENTITY = re.compile(r"&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_DOUBLE = re.compile(r"&amp;(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")

_ATTRS = r"""(?:\s+[\w:.-]+\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'<>=]+))*\s*"""
_FORMULA_ELEMENTS = r"(?:mml:)?math|maths|chem|chemistry|in-line-formulae|tables?"
_FORMULA = re.compile(rf"<({_FORMULA_ELEMENTS}){_ATTRS}>.*?</\1\s*>|<({_FORMULA_ELEMENTS}|img){_ATTRS}/>"
                      rf"|<img{_ATTRS}>", re.IGNORECASE | re.DOTALL)
_FORMULA_OR_PLACEHOLDER = re.compile(f"{re.escape(PLACEHOLDER)}|{_FORMULA.pattern}", re.IGNORECASE | re.DOTALL)
_INLINE = "sub|sup|i|b|u|o|em|strong|smallcaps|span|font|figref|claim-ref|patcit|nplcit|crossref"
_INLINE_TAG = re.compile(rf"</?(?:{_INLINE}|{_FORMULA_ELEMENTS}){_ATTRS}/?>", re.IGNORECASE)
_BREAK_TAG = re.compile(rf"</?(?:br|p|li|ul|ol|dl|dt|dd|claim-text){_ATTRS}/?>", re.IGNORECASE)

_CJK = ("\u3001-\u3003\u3005-\u3007\u3008-\u3011\u3014-\u301f\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf"
        "\u4e00-\u9fff\uf900-\ufaff\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\uff66-\uff9f"
        "\U00020000-\U0003134f")
_CJK_GAP = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
CJK_SPACES = ("keep", "collapse", "auto")
# What `repair` reports (the manifest's "repaired" keys); a double-escaped text counts as "double_escaped" only.
REPAIRS = ("entities", "double_escaped", "markup", "nfkc", "controls", "cjk_spaces")


def _is_reference(ref: str) -> bool:
    return ref[0] == "#" or ref + ";" in html5  # "&foo;" is not a reference: text


def _unescape_entity(m: re.Match) -> str:
    return html.unescape(m.group(0)) if _is_reference(m.group(1)) else m.group(0)


def unescape_entities(text: str) -> tuple[str, int]:
    """(text with references unescaped, levels undone: 0, 1 or 2 for a double-escaped text)."""
    if "&" not in text:
        return text, 0
    double = any(_is_reference(m.group(1)) for m in _DOUBLE.finditer(text))
    once = _ENTITY.sub(_unescape_entity, text)
    if double:
        return _ENTITY.sub(_unescape_entity, once), 2
    return once, int(once != text)


def replace_markup(text: str, formulas: Optional[list] = None) -> str:
    """Formula markup -> PLACEHOLDER, inline tags stripped. With a `formulas` list, appends what each
    placeholder of the result stands for, in order: the markup it replaced, or itself where the text already
    held a placeholder (so the translation can get the formulas back, `restore_formulas`)."""
    if "<" not in text:
        if formulas is not None:
            formulas.extend([PLACEHOLDER] * text.count(PLACEHOLDER))
        return text
    if formulas is None:
        text = _FORMULA.sub(PLACEHOLDER, text)
    else:
        def keep(m: re.Match) -> str:
            formulas.append(m.group(0))
            return PLACEHOLDER
        text = _FORMULA_OR_PLACEHOLDER.sub(keep, text)
    text = _BREAK_TAG.sub(" ", text)
    return _INLINE_TAG.sub("", text)


def restore_formulas(text: str, formulas: list[str]) -> str:
    """Put the source's formulas back into a translation, in order: the i-th placeholder of `text` becomes
    `formulas[i]`; placeholders beyond the source's count are dropped, and formulas the translation has no
    placeholder for are appended at its end (a formula is never lost)."""
    if not formulas and PLACEHOLDER not in text:
        return text
    parts = text.split(PLACEHOLDER)
    out = [parts[0]]
    for i, part in enumerate(parts[1:]):
        out.append(formulas[i] if i < len(formulas) else "")
        out.append(part)
    missing = formulas[len(parts) - 1:]
    return " ".join(" ".join(["".join(out), *missing]).split())


def collapse_cjk_spaces(text: str, mode: str) -> str:
    """Remove spaces between two CJK characters ("collapse"), or do so unless the text looks pre-tokenized."""
    if mode == "keep" or " " not in text:
        return text
    spaces = text.count(" ")
    if mode == "auto" and 4 * spaces >= len(text) - spaces:  # pre-tokenized: a space per 4 other characters
        return text
    return _CJK_GAP.sub("", text)


def repair(text: str, *, nfkc: bool = False, lowercase: bool = False, entities: bool = False,
           markup: bool = False, cjk_spaces: str = "keep", formulas: Optional[list] = None) -> tuple[str, set[str]]:
    """`normalize(text, ...)` and the names of the repairs that changed it (for the manifest's counters):
    "entities", "double_escaped", "markup", "nfkc", "controls", "cjk_spaces". With `markup` and a
    `formulas` list, what the placeholders stand for is appended to it (`replace_markup`)."""
    if cjk_spaces not in CJK_SPACES:
        raise ValueError(f"cjk_spaces must be one of {CJK_SPACES}, not {cjk_spaces!r}")
    changed: set[str] = set()
    if entities:
        text, levels = unescape_entities(text)
        if levels:
            changed.add("double_escaped" if levels == 2 else "entities")
    if markup:
        new = replace_markup(text, formulas)
        if new != text:
            changed.add("markup")
            text = new
    if nfkc:
        new = unicodedata.normalize("NFKC", text)
        if new != text:
            changed.add("nfkc")
            text = new
    if lowercase:
        text = text.lower()
    if _DELETE_RE.search(text):  # (a search is much faster than translating every text)
        text = text.translate(_DELETE)
        changed.add("controls")
    elif _LINE_BREAKS.search(text):
        changed.add("controls")
    text = " ".join(text.split())
    new = collapse_cjk_spaces(text, cjk_spaces)
    if new != text:
        changed.add("cjk_spaces")
    return new, changed


def normalize(text: str, *, nfkc: bool = False, lowercase: bool = False, entities: bool = False,
              markup: bool = False, cjk_spaces: str = "keep") -> str:
    """The steps of the module docstring. Every Unicode whitespace character (including U+2028, U+0085 and
    the ideographic space U+3000) becomes a space, so the result never holds a tab or a line break."""
    return repair(text, nfkc=nfkc, lowercase=lowercase, entities=entities, markup=markup,
                  cjk_spaces=cjk_spaces)[0]
