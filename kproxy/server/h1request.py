"""An HTTP/1.1 request as Go's server reads it: its head, and where its body ends.

kproxy's listener reads every request head with these rules before aiohttp's parser (llhttp)
sees a byte, so what kproxy takes to be a caller's method, target, headers and body is what the
apiserver's ``net/http`` server would take from the same bytes. The rules, each from Go's source:

* the request line (net/http ``readRequest``, ``parseRequestLine``, ``validMethod``,
  ``ParseHTTPVersion``): three parts cut at the first two spaces, any token as a method,
  ``HTTP/x.y`` with one digit each; then ``url.ParseRequestURI`` on the target (``CONNECT
  host:port`` read as an authority);
* the header lines (net/textproto ``readMIMEHeader``, ``readContinuedLineSlice``): lines end in LF
  with an optional CR before it, an obs-fold continuation line is joined to the one before with
  one space, a value keeps no leading or trailing blanks, a name may not be empty or hold anything
  but token characters and spaces, a value no control byte but HTAB;
* the body's framing (net/http/transfer.go ``parseTransferEncoding``, ``fixLength``,
  ``fixTrailer``): ``Transfer-Encoding`` is ignored on HTTP/1.0 and otherwise must be one
  ``chunked`` (else 501), and then ``Content-Length`` is dropped; several equal
  ``Content-Length`` values are one, differing ones or one that is not a decimal number are a
  400; a request with neither has no body;
* the server's own checks after that (net/http server.go ``readRequest``): HTTP/1.x only (505),
  a Host header on HTTP/1.1 unless CONNECT, no more than one, valid host bytes, valid names;
* a chunked body (net/http/internal/chunked.go, transfer.go ``readTrailer``): CRLF line ends
  only, a size line under 4096 bytes, extensions dropped, at most 16 hex digits, the overhead
  bound, a trailer ending in CRLF CRLF within 4096 bytes.

A head Go refuses is answered as Go answers it (:class:`HeadRefused`). A head Go takes is handed
to llhttp unchanged when llhttp reads it the same way, and otherwise rewritten into a form llhttp
reads as Go did (:attr:`Head.canonical`): joined folds, CRLF line ends, one ``Content-Length``
or only ``Transfer-Encoding: chunked``, the first of a header aiohttp takes only once (Go's
``Header.Get`` reads the first), and, for a method or target llhttp does not know, a stand-in
that :attr:`Head.method` and :attr:`Head.target` put back on the parsed message. A chunked body
is re-encoded chunk by chunk (:class:`ChunkedBody`), so llhttp never frames anything itself.

The module imports nothing from aiohttp but its error base class; bytes are the unit throughout.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import OrderedDict

from aiohttp.http_exceptions import BadHttpMessage

from kproxy.gocompat.url import InvalidRequestURIError, parse_request_uri

__all__ = [
    "CHUNK_LINE_MAX",
    "ChunkedBody",
    "Head",
    "HeadRefused",
    "MalformedChunked",
    "go_answer",
    "head_end",
    "read_head",
    "read_known_head",
]

GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
UNSUPPORTED_TE = b"HTTP/1.1 501 Not Implemented" + GO_ERROR_HEADERS + b"Unsupported transfer encoding"

#: Go's chunked reader's line bound (``maxLineLength``; also its bufio.Reader's size, which bounds
#: a trailer).
CHUNK_LINE_MAX = 4096

_TCHAR = rb"!#$%&'*+\-.^_`|~0-9A-Za-z"
_NOT_TOKEN = re.compile(rb"[^" + _TCHAR + rb"]")
_NAME_BYTES = re.compile(rb"[" + _TCHAR + rb" ]+")  # textproto keeps a name with spaces, uncanonicalized
_BAD_VALUE_BYTE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # textproto validHeaderValueByte
_BAD_HOST_BYTE = re.compile(rb"[^0-9A-Za-z!$%&()*+,\-.:;=\[\]'_~]")  # httpguts ValidHostHeader
#: What llhttp reads in a plain head exactly as Go does: printable ASCII, CRLF line ends, no HTAB,
#: no blank before a line end (llhttp trims values by rules of its own), token names.
_CLEAN_FIELDS = re.compile(rb"(?:[" + _TCHAR + rb"]+:(?:[\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?\r\n)*\r\n")
_PRINTABLE_LINE = re.compile(rb"[\x21-\x7e][\x20-\x7e]*")
#: In a plain head, the fields this module decides by (the others go to llhttp untouched).
_DECISIVE = re.compile(
    rb"\r\n(host|transfer-encoding|content-length|connection|trailer|content-location|content-range|content-type"
    rb"|etag|max-forwards|server|user-agent|proxy-connection|sec-websocket-key1):[ ]*([^\r\n]*)",
    re.IGNORECASE,
)
#: The end of a line followed by an empty one (CR optional before each LF).
_BLANK_LINE = re.compile(rb"\n\r?\n")
#: Targets llhttp takes and reads as the same string (origin-form, printable ASCII); any other
#: reaches it as a stand-in (kproxy reads the target from the message's ``path``).
_LLHTTP_TARGET = re.compile(rb"/[\x21-\x7e]*")
#: Methods llhttp takes (its list is longer; these suffice for the apiserver's clients).
_LLHTTP_METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE"))
#: Headers aiohttp's parser refuses to see twice (its SINGLETON_HEADERS) and Go takes, reading the
#: first (``Header.Get``). Content-Length, Transfer-Encoding and Host are judged as Go judges them.
_ONCE = frozenset(
    (b"content-location", b"content-range", b"content-type", b"etag", b"max-forwards", b"server", b"user-agent")
)


#: Headers aiohttp's parser is not shown: ``Proxy-Connection``, which llhttp takes for
#: Connection (close, upgrade) and Go's server does not (hop-by-hop, kproxy never forwards it);
#: ``Sec-WebSocket-Key1`` (the 2010 WebSocket draft's), for which aiohttp refuses the request
#: and Go's server, and the apiserver, do not (nothing reads it; it does not go upstream).
_NOT_SHOWN = frozenset((b"proxy-connection", b"sec-websocket-key1"))


def go_answer(status: bytes, why: bytes = b"") -> bytes:
    """What Go's ``conn.serve`` writes for a request it cannot read: ``HTTP/1.1 400 Bad Request``,
    or for a status error ``HTTP/1.1 400 Bad Request: why``, the same text as the body."""
    public = status + (b": " + why if why else b"")
    return b"HTTP/1.1 " + public + GO_ERROR_HEADERS + public


class HeadRefused(BadHttpMessage):
    """A head Go's server refuses; ``answer`` is what it writes before closing the connection."""

    def __init__(self, answer: bytes, why: str) -> None:
        super().__init__(why)
        self.answer = answer


def _bad(why: str) -> HeadRefused:
    return HeadRefused(go_answer(b"400 Bad Request"), why)


def _status(status: bytes, why: bytes) -> HeadRefused:
    return HeadRefused(go_answer(status, why), why.decode())


class Head:
    """A head Go takes. ``canonical`` is what llhttp is given (empty: the head as it came);
    ``method``, ``target`` and ``version`` are set where llhttp is given a stand-in for them.
    ``length`` is the body's Content-Length (0: none), ``chunked`` a chunked body."""

    __slots__ = ("canonical", "chunked", "close", "length", "method", "post", "target", "version")

    def __init__(self) -> None:
        self.canonical = b""
        self.close = False  # Go reads no request after this one (``Request.Close``, ``wantsClose``)
        self.post = False  # Go skips up to 4 CR or LF bytes before the next head
        self.method: str | None = None
        self.target: str | None = None
        self.version: tuple[int, int] | None = None
        self.length = 0
        self.chunked = False


def head_end(buf: bytes | bytearray, begin: int = 0, scanned: int = 0) -> int:
    """The offset just past the blank line that ends the head starting at ``begin`` (lines end
    in LF, a CR before it optional), or -1; ``scanned`` is where a previous search stopped."""
    if buf[begin : begin + 1] == b"\n":  # an empty request line: the head is that line
        return begin + 1
    if buf[begin : begin + 2] == b"\r\n":
        return begin + 2
    blank = _BLANK_LINE.search(buf, max(begin, scanned - 2))  # one scan, stopping at the first
    return -1 if blank is None else blank.end()


@functools.lru_cache(maxsize=1024)
def _target_refused(method: bytes, target: bytes) -> bool:
    raw = target.decode("utf-8", "surrogateescape")
    if method == b"CONNECT" and not raw.startswith("/"):
        raw = "http://" + raw  # justAuthority
    try:
        parse_request_uri(raw)
    except InvalidRequestURIError:
        return True
    return False


def _version(proto: bytes) -> tuple[int, int] | None:
    """``ParseHTTPVersion``."""
    if proto == b"HTTP/1.1":
        return 1, 1
    if proto == b"HTTP/1.0":
        return 1, 0
    if (
        len(proto) != 8
        or not proto.startswith(b"HTTP/")
        or proto[6:7] != b"."
        or not (proto[5:6].isdigit() and proto[7:8].isdigit())
    ):
        return None
    return proto[5] - 48, proto[7] - 48


def _lines(head: bytes) -> list[bytes]:
    """The head's lines without their ends (an LF and a CR before it; the blank one dropped)."""
    lines = head.split(b"\n")
    lines.pop()  # after the last LF
    lines.pop()  # the blank line
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def read_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """textproto ``readMIMEHeader`` on header lines: (name, value) pairs, folds joined. Raises
    :class:`HeadRefused` for what it refuses (each a plain 400 from Go)."""
    fields: list[tuple[bytes, bytes]] = []
    if lines and lines[0][:1] in (b" ", b"\t"):
        raise _bad("malformed MIME header initial line")
    pending: list[bytes] = []  # a field's line and its folds (joined once: no quadratic copying)
    for line in [*lines, None]:
        if line is not None and line[:1] in (b" ", b"\t"):
            pending.append(line.strip(b" \t"))  # a first line that is a fold was refused above
            continue
        if pending:
            name, colon, value = b" ".join(pending).partition(b":")
            if not colon:
                raise _bad("malformed MIME header: missing colon")
            if not name or _NAME_BYTES.fullmatch(name) is None or _BAD_VALUE_BYTE.search(value):
                raise _bad("malformed MIME header line")
            fields.append((name, value.lstrip(b" \t")))
        if line is None:
            break
        pending = [line.strip(b" \t")]
        if b":" not in pending[0]:
            raise _bad("malformed MIME header: missing colon")
    return fields


def read_head(head: bytes, quick: bool = True) -> Head:
    """Go's reading of one request head (``head`` ends with its blank line); raises
    :class:`HeadRefused` with Go's answer where Go refuses it, in Go's order.

    A head whose header lines are all plain (``_CLEAN_FIELDS``: token names, printable values,
    CRLF) is read ``quick``ly: only the fields a decision here depends on are taken out of it, in
    C, and it goes to llhttp as it came. Any other head, or a plain one needing a rewrite, is read
    line by line (``read_fields``)."""
    first = head.find(b"\n") + 1
    line = head[: first - 1].removesuffix(b"\r") if first else head
    method, sp1, rest = line.partition(b" ")
    target, sp2, proto = rest.partition(b" ")
    if not sp1 or not sp2:
        raise _bad("malformed HTTP request")
    if not method or _NOT_TOKEN.search(method):
        raise _bad("invalid method")
    version = _version(proto)
    if version is None:
        raise _bad("malformed HTTP version")
    if _target_refused(method, target):
        raise _bad("invalid request target")
    if quick and head[first - 2 : first] == b"\r\n" and _CLEAN_FIELDS.fullmatch(head, first):
        fields, clean = _DECISIVE.findall(head, first - 2), _PRINTABLE_LINE.fullmatch(line) is not None
    else:
        fields = read_fields(_lines(head)[1:] if len(head) > 2 else [])
        clean, quick = False, False
    out = Head()
    out.post = method == b"POST"
    keep: list[tuple[bytes, bytes]] = []
    hosts = 0
    host = b""
    te: list[bytes] = []
    cl: list[bytes] = []
    seen: set[bytes] = set()
    spaced = False
    for name, value in fields:
        lower = name.lower()
        if lower == b"host":
            hosts += 1
            host = value
        elif lower == b"transfer-encoding":
            te.append(value)
            continue
        elif lower == b"content-length":
            cl.append(value)
            continue
        elif lower in _NOT_SHOWN:
            clean = False
            continue
        elif lower in _ONCE:
            if lower in seen:
                clean = False
                continue
            seen.add(lower)
        if b" " in name:
            spaced = True
        keep.append((name, value))
    if hosts > 1:
        raise _bad("too many Host headers")
    out.close = _closes(version, [v for n, v in fields if n.lower() == b"connection"])
    # readTransfer: parseTransferEncoding, then fixLength.
    if te and version >= (1, 1):
        if len(te) != 1 or te[0].lower() != b"chunked":  # ascii.EqualFold
            raise HeadRefused(UNSUPPORTED_TE, "unsupported transfer encoding")
        out.chunked = True
        keep.append((b"Transfer-Encoding", b"chunked"))
        clean = clean and not cl and te[0] == b"chunked"
    elif te:
        clean = False  # ignored on HTTP/1.0: the body is framed by Content-Length alone
    if cl:  # checked even where chunked framing then drops it
        declared = cl[0].strip(b" \t\r\n")
        if any(v.strip(b" \t\r\n") != declared for v in cl[1:]):
            raise _bad("multiple Content-Length headers")
        if not declared.isdigit() or not declared.isascii() or int(declared) >= 1 << 63:
            raise _bad("bad Content-Length")
        if not out.chunked:
            out.length = int(declared)
            keep.append((b"Content-Length", declared))
            clean = clean and len(cl) == 1
    if out.chunked:
        _check_trailer_keys(keep)
    # server.go readRequest, after readRequest returned.
    if version == (2, 0) and method == b"PRI" and target == b"*":
        raise _bad("an HTTP/2 preface on an HTTP/1.1 connection")  # no h2c: Go hands it to a handler
    if version[0] != 1:
        raise _status(b"505 HTTP Version Not Supported", b"unsupported protocol version")
    if version >= (1, 1) and hosts == 0 and method != b"CONNECT":
        raise _status(b"400 Bad Request", b"missing required Host header")
    if hosts == 1 and _BAD_HOST_BYTE.search(host):
        raise _status(b"400 Bad Request", b"malformed Host header")
    if spaced:
        raise _status(b"400 Bad Request", b"invalid header name")
    if method not in _LLHTTP_METHODS:
        out.method = method.decode("ascii")
        method, clean = b"GET", False
    if _LLHTTP_TARGET.fullmatch(target) is None:
        out.target = target.decode("utf-8", "surrogateescape")
        target, clean = b"/", False
    if version[1] > 1:
        out.version = version
        clean = False
    if clean:
        return out  # llhttp is given the head as it came
    if quick:  # plain, but llhttp must be given it rewritten: every field is needed
        return read_head(head, quick=False)
    parts = [method, b" ", target, b" HTTP/1.%d\r\n" % min(version[1], 1)]
    if not hosts and version >= (1, 1):
        parts.append(b"Host: \r\n")  # CONNECT needs none; aiohttp's parser does
    for name, value in keep:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    out.canonical = b"".join(parts)
    return out


def _token_in(values: list[bytes], token: bytes) -> bool:
    """httpguts ``HeaderValuesContainsToken``: a comma-separated element equal to ``token``."""
    return any(e.strip(b" \t").lower() == token and e.strip(b" \t").isascii() for v in values for e in v.split(b","))


def _has_token(value: bytes, token: bytes) -> bool:
    """net/http ``hasToken``: ``token`` bounded by space, comma or tab, ASCII case folded."""
    return re.search(rb"(?:^|[ ,\t])" + re.escape(token) + rb"(?:$|[ ,\t])", value, re.IGNORECASE) is not None


def _closes(version: tuple[int, int], connection: list[bytes]) -> bool:
    """Whether Go's server closes the connection after this request (server.go
    ``chunkWriter.writeHeader``): on HTTP/1.0 unless the first Connection value names
    ``keep-alive`` (``wantsHttp10KeepAlive``; the answer must then carry its length, which
    aiohttp sees to); on HTTP/1.1 when ``close`` is a token of any value (``shouldClose``) or of
    the first (``wantsClose``)."""
    first = connection[0] if connection else b""
    if version < (1, 1):
        return not _has_token(first, b"keep-alive")
    return _token_in(connection, b"close") or _has_token(first, b"close")


_FORBIDDEN_TRAILERS = frozenset((b"transfer-encoding", b"trailer", b"content-length"))


def _check_trailer_keys(fields: list[tuple[bytes, bytes]]) -> None:
    """transfer.go ``fixTrailer`` for a chunked request: a Trailer header may not name these."""
    for name, value in fields:
        if name.lower() == b"trailer":
            for key in value.split(b","):
                if key.strip(b" \t\r\n").lower() in _FORBIDDEN_TRAILERS:
                    raise _bad("bad trailer key")


#: Heads up to this size are remembered (``read_known_head``).
KNOWN_HEAD_MAX = 2048


_KNOWN: OrderedDict[bytes, Head] = OrderedDict()
_KNOWN_MAX = 1024


def read_known_head(head: bytes) -> Head:
    """``read_head``, remembering the readings of the last 1,024 small heads that go to llhttp as
    they came: controllers and kubelets send the same requests over and over, byte for byte, and
    reading a head was a tenth of a small GET's CPU in kproxy. They are remembered by a 128-bit
    BLAKE2b digest, so no head (and no bearer token in one) is kept; a Head is never changed once
    read. Refusals and rewritten heads are not remembered."""
    if len(head) > KNOWN_HEAD_MAX:
        return read_head(head)
    key = hashlib.blake2b(head, digest_size=16).digest()
    known = _KNOWN.get(key)
    if known is not None:
        _KNOWN.move_to_end(key)
        return known
    read = read_head(head)
    if not read.canonical:
        _KNOWN[key] = read
        if len(_KNOWN) > _KNOWN_MAX:
            _KNOWN.popitem(last=False)
    return read


def _int64(n: int) -> int:
    """``n`` as Go's int64 holds it (two's complement, wrapping)."""
    return ((n + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


#: A size line llhttp reads as Go does, handed on as it came: hex digits, CRLF.
_PLAIN_SIZE = re.compile(rb"([0-9a-fA-F]{1,16})\r\n")


class MalformedChunked(Exception):
    """A chunked body Go's reader refuses; ``str`` is its error text, ``pieces`` the re-encoded
    data read before it (Go's reader hands that on before its error)."""

    pieces: list[bytes] = []


class ChunkedBody:
    """Go's chunked reader over a body arriving in pieces: :meth:`feed` takes the bytes from
    ``pos`` and returns the same chunks re-encoded (what llhttp is given), where it stopped, and
    whether the body (with its trailer) ended there. Raises :class:`MalformedChunked`."""

    __slots__ = ("_data", "_excess", "_state")

    _SIZE, _DATA, _CRLF, _TRAILER = range(4)

    def __init__(self) -> None:
        self._state = self._SIZE
        self._data = 0  # bytes left in the current chunk
        self._excess = 0  # chunked.go's overhead account

    def feed(self, buf: bytes, pos: int) -> tuple[list[bytes], int, bool]:
        out: list[bytes] = []
        try:
            return self._feed(buf, pos, out)
        except MalformedChunked as err:
            err.pieces = out
            raise

    def _feed(self, buf: bytes, pos: int, out: list[bytes]) -> tuple[list[bytes], int, bool]:
        end = len(buf)
        while pos < end:
            state = self._state
            if state == self._DATA:
                n = min(self._data, end - pos)
                out.append(buf[pos : pos + n])
                self._data -= n
                pos += n
                if not self._data:
                    self._state = self._CRLF
            elif state == self._CRLF:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise MalformedChunked("malformed chunked encoding")
                out.append(b"\r\n")
                pos += 2
                self._state = self._SIZE
            elif state == self._SIZE:
                pos = self._whole_chunks(buf, pos, out)
                plain = _PLAIN_SIZE.match(buf, pos)
                if plain is not None:  # the usual size line (no extension, no blanks), kept as it came
                    size, line = int(plain[1], 16), plain[0]
                    self._account(len(plain[1]), size)
                    pos = plain.end()
                else:
                    nl = buf.find(b"\n", pos, pos + CHUNK_LINE_MAX)
                    if nl < 0:
                        if end - pos >= CHUNK_LINE_MAX:
                            raise MalformedChunked("header line too long")
                        break
                    size = self._size(buf[pos : nl + 1])
                    line, pos = b"%x\r\n" % size, nl + 1
                if size == 0:
                    self._state = self._TRAILER
                    continue
                out.append(line)
                self._data = size
                self._state = self._DATA
            else:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] == b"\r\n":
                    out.append(b"0\r\n\r\n")
                    return out, pos + 2, True
                stop = buf.find(b"\r\n\r\n", pos, pos + CHUNK_LINE_MAX)
                if stop < 0:
                    if end - pos >= CHUNK_LINE_MAX:
                        raise MalformedChunked("http: suspiciously long trailer after chunked body")
                    break
                trailer = buf[pos : stop + 4]
                last = head_end(b"x\r\n" + trailer) - 3  # ReadMIMEHeader stops at the first blank line
                try:
                    read_fields(_lines(b"x\r\n" + trailer[:last])[1:])
                except HeadRefused as err:
                    raise MalformedChunked(str(err.message)) from None
                out.append(b"0\r\n\r\n")  # trailers are not forwarded (the apiserver reads none)
                return out, pos + last, True
        return out, pos, False

    def _size(self, line: bytes) -> int:
        """chunked.go ``readChunkLine``, ``removeChunkExtension``, ``parseHexUint`` on a size line
        (with its LF), keeping the overhead account of ``beginChunk``."""
        cr = line.find(b"\r")
        if cr < 0:
            raise MalformedChunked("chunked line ends with bare LF")
        if cr != len(line) - 2:
            raise MalformedChunked("invalid CR in chunked line")
        p = line[:-2]
        if len(p) >= CHUNK_LINE_MAX:
            raise MalformedChunked("header line too long")
        line_length = len(p)
        p = p.rstrip(b" \t\r\n").partition(b";")[0]
        if not p:
            raise MalformedChunked("empty hex number for chunk length")
        n = 0
        for i, b in enumerate(p):
            if 48 <= b <= 57:
                d = b - 48
            elif 97 <= b <= 102:
                d = b - 87
            elif 65 <= b <= 70:
                d = b - 55
            else:
                raise MalformedChunked("invalid byte in chunk length")
            if i == 16:
                raise MalformedChunked("http chunk length too large")
            n = (n << 4) | d
        self._account(line_length, n)
        return n

    def _whole_chunks(self, buf: bytes, pos: int, out: list[bytes]) -> int:
        """From ``pos``, the run of whole plain chunks (a plain size line, its data, CRLF) that
        ``buf`` holds, handed on as one piece as they came (llhttp reads them as Go does); where
        the run stops. Many small chunks cost one regex match each, not a pass of the state
        machine."""
        start, end = pos, len(buf)
        match = _PLAIN_SIZE.match
        while (plain := match(buf, pos)) is not None:
            size = int(plain[1], 16)
            stop = plain.end() + size
            if size == 0 or stop + 2 > end:
                break
            if buf[stop : stop + 2] != b"\r\n":
                break  # the state machine reads it (and refuses it), after the run is handed on
            self._account(len(plain[1]), size)
            pos = stop + 2
        if pos > start:
            out.append(buf[start:pos])
        return pos

    def _account(self, line_length: int, n: int) -> None:
        """``beginChunk``'s bound on bytes that are not data (in Go's int64 arithmetic, whose
        wrapping a chunk size near 2^63 reaches)."""
        if n < 1 << 61:
            excess = self._excess + line_length + 2 - 16 - 2 * n
            self._excess = excess if excess > 0 else 0
        else:
            excess = _int64(self._excess + line_length + 2)
            self._excess = max(_int64(excess - _int64(16 + _int64(2 * _int64(n)))), 0)
        if self._excess > 16 * 1024:
            raise MalformedChunked("chunked encoding contains too much non-data")
