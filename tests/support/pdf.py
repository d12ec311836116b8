"""Small PDFs built byte by byte (a correct xref table, Helvetica text, an image-only page,
an encrypted copy), for the extraction tests."""

from __future__ import annotations

import io
from collections.abc import Sequence


def build_pdf(objects: Sequence[bytes], info: bytes | None = None) -> bytes:
    """A PDF with a correct xref table; object 1 is the catalog."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    size = len(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    trailer = b"/Size %d /Root 1 0 R" % size
    if info is not None:
        trailer += b" /Info " + info
    out += b"trailer\n<< " + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def pdf_stream(data: bytes, extra: bytes = b"") -> bytes:
    return b"<< /Length %d%s >>\nstream\n" % (len(data), extra) + data + b"\nendstream"


FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def pdf_with_pages(contents: Sequence[bytes], *, info: bytes | None = None,
                   flate: bool = False) -> bytes:
    """Catalog, pages, a font, then one page + content stream per item of ``contents``."""
    n = len(contents)
    kids = b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % n, FONT]
    for i, content in enumerate(contents):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (5 + 2 * i))
        objects.append(pdf_stream(content, b" /Filter /FlateDecode" if flate else b""))
    if info is not None:
        objects.append(info)
        return build_pdf(objects, info=b"%d 0 R" % len(objects))
    return build_pdf(objects)


def text_pdf(*lines: bytes, info: bytes | None = None) -> bytes:
    ops = b" ".join(b"(%s) Tj 0 -14 Td" % line for line in lines)
    return pdf_with_pages([b"BT /F1 12 Tf 72 720 Td " + ops + b" ET"], info=info)


def image_only_pdf() -> bytes:
    """A page that paints a grey square and has no text operators: what a scan looks like."""
    return pdf_with_pages([b"q 100 0 0 100 72 600 cm 0.5 g 0 0 1 1 re f Q"])


def encrypted_pdf(user_password: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(b"Hello runbook"))))
    writer.encrypt(user_password, "owner-secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
