"""Narrative XHTML as R4 allows it (``Narrative.div``, invariants ``txt-1`` and ``txt-2``).

R4 (narrative.html): the XHTML is a ``div`` in the XHTML namespace holding only the basic formatting
elements and attributes of HTML 4.0 (chapters 7-11 and 15, ``<a>`` with ``name`` or ``href``, images,
``style`` attributes), and no head, body, scripts, forms, frames, objects, external style sheets or
event attributes (``onclick`` ...); and it has some non-whitespace content. The element and attribute
lists below are the ones HL7's reference validator (``InstanceValidator``) checks. Parsed by the
standard library's expat, with document type declarations refused up front (no entities to expand).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

XHTML_NS = "http://www.w3.org/1999/xhtml"
_NS = "{" + XHTML_NS + "}"

ELEMENTS = frozenset({
    "p", "br", "div", "h1", "h2", "h3", "h4", "h5", "h6", "a", "span", "b", "em", "i", "strong", "small", "big",
    "tt", "dfn", "q", "var", "abbr", "acronym", "cite", "blockquote", "hr", "address", "bdo", "kbd", "sub", "sup",
    "ul", "ol", "li", "dl", "dt", "dd", "pre", "table", "caption", "colgroup", "col", "thead", "tr", "tfoot",
    "tbody", "th", "td", "code", "samp", "img", "map", "area",
})
#: attributes every allowed element may carry (core, i18n, and the table cell/column ones)
ATTRIBUTES = frozenset({
    "title", "style", "class", "id", "lang", "{http://www.w3.org/XML/1998/namespace}lang", "dir", "accesskey",
    "tabindex", "span", "width", "align", "valign", "char", "charoff", "abbr", "axis", "headers", "scope",
    "rowspan", "colspan",
})
#: and the ones particular to an element
ELEMENT_ATTRIBUTES = {
    "a": frozenset({"href", "name"}),
    "img": frozenset({"src", "alt", "height", "width", "border"}),
    "table": frozenset({"border", "cellpadding", "cellspacing", "summary", "frame", "rules"}),
    "area": frozenset({"href", "alt", "shape", "coords", "nohref"}),
    "map": frozenset({"name"}),
    "ol": frozenset({"start", "type"}),
    "ul": frozenset({"type"}),
    "li": frozenset({"value", "type"}),
    "td": frozenset({"nowrap"}),
    "th": frozenset({"nowrap"}),
}
_URL_ATTRIBUTES = ("href", "src")


def xhtml_problem(text: str) -> str | None:
    """Why ``text`` is not narrative XHTML R4 allows; None if it is."""
    if "<!" in text.replace("<!--", ""):
        return "xhtml must not contain a document type declaration, entity declaration or CDATA section"
    if "<?" in text:
        return "xhtml must not contain processing instructions"
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        return f"xhtml is not well-formed XML: {exc}"
    if root.tag != _NS + "div":
        local = root.tag.rsplit("}", 1)[-1]
        if local == "div":
            return f'the narrative <div> must be in the XHTML namespace (xmlns="{XHTML_NS}")'
        return f"xhtml must be a <div> element, not <{local}>"
    content = False
    for el in root.iter():
        if not el.tag.startswith(_NS):
            return f"<{el.tag}> is not an XHTML element: the narrative holds XHTML only (txt-1)"
        name = el.tag[len(_NS):]
        if name not in ELEMENTS:
            return f"<{name}> is not allowed in a narrative (txt-1: basic formatting only, no scripts, forms, " \
                   "frames, objects or styles sheets)"
        own = ELEMENT_ATTRIBUTES.get(name, frozenset())
        for attr, value in el.attrib.items():
            if attr not in ATTRIBUTES and attr not in own:
                kind = "event attribute" if attr.lower().startswith("on") else "attribute"
                return f"the {kind} {attr!r} of <{name}> is not allowed in a narrative (txt-1)"
            if attr in _URL_ATTRIBUTES and value.strip().lower().startswith(("javascript:", "vbscript:")):
                return f"<{name} {attr}> must not run script (txt-1)"
        content = content or name == "img" or bool((el.text or "").strip()) or bool((el.tail or "").strip()
                                                                                       and el is not root)
    if not content:
        return "the narrative must have some non-whitespace content (txt-2)"
    return None
