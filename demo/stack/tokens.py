"""A JWT issuer for tests and the demo: an RS256 key pair, its public JWKS, the tokens it signs.

    issuer = Issuer("k1", "https://issuer.mesh.test", "mesh-gateway")
    issuer.jwks                       # inline `jwks:` of a RequestAuthentication jwtRule
    issuer.token(sub="jane", tenant="acme")
    issuer.token(exp_in=-120)         # expired; a claim given (iss=, aud=) replaces the default
    Issuer("k1", ...).token()         # forged: the same kid under another key
    issuer.serve()                    # the JWKS over HTTP (`jwksUri`), .port, .fetches; .stop()
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt as pyjwt
from jwcrypto import jwk

from mcp26.demo.stack.ports import free_port


class Issuer:
    def __init__(self, kid: str, issuer: str, audience: str):
        self.kid, self.issuer, self.audience = kid, issuer, audience
        key = jwk.JWK.generate(kty="RSA", size=2048, kid=kid)
        self.pem = key.export_to_pem(private_key=True, password=None)
        self.jwks = json.dumps({"keys": [{**json.loads(key.export_public()), "alg": "RS256", "use": "sig"}]})
        self.fetches = 0
        self.port: int | None = None
        self.server: ThreadingHTTPServer | None = None

    def token(self, exp_in: int = 600, **claims) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "aud": self.audience, "iat": now, "exp": now + exp_in, **claims}
        return pyjwt.encode(body, self.pem, algorithm="RS256", headers={"kid": self.kid})

    def serve(self) -> "Issuer":
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                issuer.fetches += 1
                body = issuer.jwks.encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
