"""A generated root -> intermediate -> leaf chain for 127.0.0.1, the root appended to a public-sized CA bundle
(certifi's), and an HTTPS server on 127.0.0.1 that presents the leaf with its intermediate."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, NamedTuple, Tuple

from tests.report.receiver import make_ca_signed_certificate


class Chain(NamedTuple):
    """The files of one generated chain: the root, the bundle holding it, the server's chain file and key."""

    root: str
    bundle: str  # certifi's cacert.pem with the root appended
    public_only: str  # certifi's cacert.pem alone (the root not in it)
    server_chain: str  # the leaf, then the intermediate
    server_key: str


def _ca(directory: Path, name: str, pathlen: int, issuer: Tuple[str, str] = ("", "")) -> Tuple[str, str]:
    """A CA certificate (self-signed, or issued by ``issuer``); (cert, key) paths."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    signer = ["-CA", issuer[0], "-CAkey", issuer[1]] if issuer[0] else []
    subprocess.run(["openssl", "req", "-x509", *signer, "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj",
                    f"/O=Gpuguard Test Fleet/CN={name}",
                    "-addext", f"basicConstraints=critical,CA:TRUE,pathlen:{pathlen}",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign"], check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def make_chain(directory: Path, name: str = "fleet") -> Chain:
    """A root, an intermediate it issued, a leaf for 127.0.0.1 the intermediate issued; the root in a copy of
    certifi's bundle."""
    import certifi

    root = _ca(directory, f"{name} root", 1)
    intermediate = _ca(directory, f"{name} intermediate", 0, root)
    leaf, key = make_ca_signed_certificate(directory, f"{name}-leaf", intermediate)
    public = Path(certifi.where()).read_bytes()
    bundle = directory / f"{name}-bundle.pem"
    bundle.write_bytes(public + b"\n" + Path(root[0]).read_bytes())
    public_only = directory / "public-only.pem"
    public_only.write_bytes(public)
    server_chain = directory / f"{name}-server-chain.pem"
    server_chain.write_bytes(Path(leaf).read_bytes() + Path(intermediate[0]).read_bytes())
    return Chain(root[0], str(bundle), str(public_only), str(server_chain), key)


class _Handler(BaseHTTPRequestHandler):
    """304 to every GET (a policy probe's answer), an empty acknowledgement to every POST (a delivery's)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(304)
        self.send_header("ETag", '"bundle-3"')
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"accepted": [], "duplicates": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: object) -> None:
        pass


def serve_https(chain: Chain) -> Iterator[str]:
    """An HTTPS server on 127.0.0.1 presenting the chain's leaf and intermediate; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain.server_chain, chain.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
