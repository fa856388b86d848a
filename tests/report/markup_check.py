"""What tests read back from a page: its elements, checked for balance, and anything that could run."""

from __future__ import annotations

from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr",
        # SVG shapes are written self-closed (<rect .../>): html.parser reports them as start+end
        }


class Elements(HTMLParser):
    """Every start tag with its attributes; the text of each <script>; an error for an unbalanced tree."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._open: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")
        if tag not in VOID:
            self._open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self._open and self._open[-1] == tag, f"</{tag}> closes <{self._open[-1] if self._open else None}>"
        self._open.pop()
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def parse(page: str) -> Elements:
    parser = Elements()
    parser.feed(page)
    parser.close()
    assert parser._open == [], f"unclosed: {parser._open}"
    return parser
