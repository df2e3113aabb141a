"""The small programs a VPC host runs, as code: an HTTP(S) server that answers its name, an ICMP
ping, and the self-signed certificates the HTTPS tests serve.

They run as `python -c <code>` inside a host's namespace (the machine has no
iputils-ping, and the server's options are what the listener tests need).
"""

from __future__ import annotations

# Marker in the HTTP server's command line: proves a recorded pid is still
# our server before we signal it.
HTTPD_MARKER = "lbagent-devtools-httpd"


# argv: text, port, and optionally a JSON object of options (all off by default):
#   echo: true            the body's second line is JSON {"peer", "path", "headers", "proxy"}
#                         of what the server saw (peer address, request headers)
#   set_cookie: "NAME"    every answer sets NAME=<text>-session
#   proxy_protocol: true  every connection starts with a PROXY protocol v1 line
#   tls: [cert, key]      serve HTTPS with these PEM files
#   http11: true          answer HTTP/1.1 (persistent connections) instead of HTTP/1.0
HTTPD_CODE = (
    f"# {HTTPD_MARKER}\n"
    + """
import http.server, json, socket, ssl, sys
TEXT = sys.argv[1]
OPTIONS = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}

class Handler(http.server.BaseHTTPRequestHandler):
    proxy_line = None

    def handle(self):
        if OPTIONS.get("proxy_protocol"):
            # A v1 header is one line of at most 107 bytes, before any request.
            self.proxy_line = self.rfile.readline(108).decode("ascii", "replace").strip()
        super().handle()

    def _body(self):
        if not OPTIONS.get("echo"):
            return (TEXT + "\\n").encode()
        headers = {name: ", ".join(self.headers.get_all(name)) for name in self.headers.keys()}
        # An IPv4 peer of the dual-stack socket is shown as IPv4, not as ::ffff:a.b.c.d.
        peer = self.client_address[0].removeprefix("::ffff:")
        seen = {"peer": peer, "path": self.path, "headers": headers, "proxy": self.proxy_line}
        return (TEXT + "\\n" + json.dumps(seen) + "\\n").encode()

    def _answer(self, with_body=True):
        body = self._body()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if OPTIONS.get("set_cookie"):
            self.send_header("Set-Cookie", OPTIONS["set_cookie"] + "=" + TEXT + "-session; Path=/")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    # haproxy's httpchk defaults to OPTIONS; answer every method alike.
    do_GET = do_POST = do_OPTIONS = _answer

    def do_HEAD(self):
        self._answer(with_body=False)

    def log_message(self, *args):
        pass

if OPTIONS.get("http11"):
    Handler.protocol_version = "HTTP/1.1"

# One socket for IPv4 and IPv6 clients.
class DualStackServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
    allow_reuse_address = True

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

server = DualStackServer(("::", int(sys.argv[2])), Handler)
if OPTIONS.get("tls"):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*OPTIONS["tls"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""
)


def self_signed_certificate(common_name: str, alt_names: tuple[str, ...] = (), days: int = 2) -> tuple[str, str]:
    """(certificate PEM, unencrypted private key PEM) for `common_name`, RSA 2048, valid `days` days.

    RSA, so that both the ECDHE-RSA and the plain RSA key exchange can be
    tried against it. Needs the `cryptography` package (a test extra).
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in (common_name, *alt_names)]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


# iputils-ping is not among the machine's packages: a minimal ICMP echo in
# Python (raw socket, root inside the namespace) instead.
PING_CODE = """
import os, socket, struct, sys, time
dst, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
ident, payload = os.getpid() & 0xFFFF, b"lbagent-devtools-ping!"  # even length for the checksum

def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF

sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
seq = 0
while time.monotonic() < deadline:
    seq += 1
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    packet = struct.pack("!BBHHH", 8, 0, checksum(header + payload), ident, seq) + payload
    sent = time.monotonic()
    sock.sendto(packet, (dst, 0))
    while (left := min(sent + 0.5, deadline) - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data, (src, _) = sock.recvfrom(2048)
        except socket.timeout:
            break
        ihl = (data[0] & 0x0F) * 4
        kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
        if kind == 0 and rid == ident and src == dst:
            print(f"reply from {dst}: icmp_seq={rseq} time={(time.monotonic() - sent) * 1000:.1f} ms")
            sys.exit(0)
sys.exit(f"no ICMP echo reply from {dst}")
"""
