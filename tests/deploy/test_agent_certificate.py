"""deploy/kubernetes/agent-certificate.sh against a fake Kubernetes API server on loopback: the
DaemonSet's init container gets a certificate naming its own node (spec.nodeName) from a
CertificateRequest, writes key, certificate and CA where the agent reads them, and fails loudly
(non-zero, a message) when the request is denied. The fake server signs with openssl as
cert-manager's CA Issuer would. Needs openssl and curl."""

import base64
import http.server
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import unittest

SOURCE_DIR = os.path.abspath(os.environ.get(
    "STEPWATCH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE_DIR, "deploy", "kubernetes", "agent-certificate.sh")
TOKEN = "agent-sa-token-0123456789"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class FakeApiServer:
    """certificaterequests of one namespace: DELETE, POST (signed at once or denied), GET."""

    def __init__(self, tmpdir, deny=False):
        self.tmpdir, self.deny = tmpdir, deny
        self.requests = {}   # name -> the CertificateRequest as posted
        self.log = []        # (method, path, authorized)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=stepwatch-ca",
                cwd=tmpdir)
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-days", "2", "-keyout", "api.key", "-out", "api.pem", "-subj", "/CN=api",
                "-addext", "subjectAltName=IP:127.0.0.1", cwd=tmpdir)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, doc):
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def handle_any(self):
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                server.log.append((self.command, self.path, ok))
                prefix = "/apis/cert-manager.io/v1/namespaces/stepwatch/certificaterequests"
                if not ok or not self.path.startswith(prefix):
                    return self.reply(403, {"kind": "Status", "reason": "Forbidden"})
                name = self.path[len(prefix) + 1:]
                if self.command == "DELETE":
                    if server.requests.pop(name, None) is None:
                        return self.reply(404, {"kind": "Status", "reason": "NotFound"})
                    return self.reply(200, {"kind": "Status", "status": "Success"})
                if self.command == "POST":
                    doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    server.requests[doc["metadata"]["name"]] = doc
                    return self.reply(201, doc)
                doc = server.requests.get(name)
                if doc is None:
                    return self.reply(404, {"kind": "Status", "reason": "NotFound"})
                return self.reply(200, server.status(doc))

            do_GET = do_POST = do_DELETE = handle_any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(tmpdir, "api.pem"), os.path.join(tmpdir, "api.key"))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def status(self, doc):
        """The request as cert-manager leaves it: signed by the CA, or denied."""
        doc = dict(doc)
        if self.deny:
            doc["status"] = {"conditions": [{"type": "Denied", "status": "True",
                                             "reason": "Denied", "message": "policy"}]}
            return doc
        csr = os.path.join(self.tmpdir, "req.csr")
        with open(csr, "wb") as f:
            f.write(base64.b64decode(doc["spec"]["request"]))
        openssl("x509", "-req", "-in", "req.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-copy_extensions", "copy", "-out", "signed.pem",
                cwd=self.tmpdir)
        with open(os.path.join(self.tmpdir, "signed.pem"), "rb") as f:
            cert = base64.b64encode(f.read()).decode()
        with open(os.path.join(self.tmpdir, "ca.pem"), "rb") as f:
            ca = base64.b64encode(f.read()).decode()
        doc["status"] = {"certificate": cert, "ca": ca,
                         "conditions": [{"type": "Ready", "status": "True", "reason": "Issued"}]}
        return doc

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@unittest.skipUnless(shutil.which("openssl") and shutil.which("curl"), "needs openssl and curl")
class AgentCertificateTest(unittest.TestCase):

    def setUp(self):
        self.tmpdir = tempfile.mkdtemp(prefix="stepwatch-agent-cert-")
        self.sa = os.path.join(self.tmpdir, "sa")
        self.tls = os.path.join(self.tmpdir, "tls")
        os.makedirs(self.sa)
        os.makedirs(self.tls)
        with open(os.path.join(self.sa, "namespace"), "w") as f:
            f.write("stepwatch")
        with open(os.path.join(self.sa, "token"), "w") as f:
            f.write(TOKEN)

    def tearDown(self):
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def run_script(self, api, node="gpu-node-7", *args):
        shutil.copy(os.path.join(api.tmpdir, "api.pem"), os.path.join(self.sa, "ca.crt"))
        env = {"PATH": "/usr/bin:/bin", "NODE_NAME": node, "STEPWATCH_TLS_DIR": self.tls,
               "STEPWATCH_SA_DIR": self.sa, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(api.port), "STEPWATCH_CERT_WAIT": "10"}
        return subprocess.run(["/bin/sh", SCRIPT, *args], env=env, capture_output=True, text=True,
                              timeout=60)

    def x509(self, *args):
        return subprocess.run(["openssl", "x509", "-noout", "-in",
                               os.path.join(self.tls, "tls.crt"), *args],
                              capture_output=True, text=True, check=True).stdout

    def test_init_container_gets_a_certificate_for_its_node(self):
        api_dir = os.path.join(self.tmpdir, "api")
        os.makedirs(api_dir)
        with FakeApiServer(api_dir) as api:
            result = self.run_script(api)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("certificate for node gpu-node-7 written", result.stderr)
            # It asked the stepwatch CA Issuer for a client certificate named after the node.
            (request,) = api.requests.values()
            self.assertEqual(request["metadata"]["name"], "stepwatch-agent-gpu-node-7")
            self.assertEqual(request["spec"]["issuerRef"],
                             {"name": "stepwatch-ca", "kind": "Issuer", "group": "cert-manager.io"})
            self.assertIn("client auth", request["spec"]["usages"])
            self.assertTrue(all(ok for _, _, ok in api.log), api.log)
            # Replaced, not piled up: the old request is deleted first.
            self.assertEqual(api.log[0][0], "DELETE")
            # A second run (a restarted pod) replaces the request and the files.
            self.assertEqual(self.run_script(api).returncode, 0)
            self.assertEqual(len(api.requests), 1)
            with open(os.path.join(api_dir, "ca.pem")) as f:
                ca = f.read()
        # The agent's --tls-cert, --tls-key, --tls-ca: first DNS name and CN = --node.
        self.assertIn("DNS:gpu-node-7", self.x509("-ext", "subjectAltName"))
        self.assertIn("CN = gpu-node-7", self.x509("-subject"))
        with open(os.path.join(self.tls, "ca.crt")) as f:
            self.assertEqual(f.read(), ca)
        self.assertEqual(os.stat(os.path.join(self.tls, "tls.key")).st_mode & 0o077, 0)
        pub_cert = subprocess.run(["openssl", "x509", "-noout", "-pubkey", "-in",
                                   os.path.join(self.tls, "tls.crt")],
                                  capture_output=True, text=True, check=True).stdout
        pub_key = subprocess.run(["openssl", "pkey", "-pubout", "-in",
                                  os.path.join(self.tls, "tls.key")],
                                 capture_output=True, text=True, check=True).stdout
        self.assertEqual(pub_cert, pub_key)
        # Nothing half-written is left behind.
        self.assertEqual(sorted(os.listdir(self.tls)), ["ca.crt", "tls.crt", "tls.key"])

    def test_a_denied_request_fails_the_init_container(self):
        api_dir = os.path.join(self.tmpdir, "api")
        os.makedirs(api_dir)
        with FakeApiServer(api_dir, deny=True) as api:
            result = self.run_script(api)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("denied or failed", result.stderr)
        self.assertEqual(os.listdir(self.tls), [])

    def test_a_wrong_token_fails_the_init_container(self):
        api_dir = os.path.join(self.tmpdir, "api")
        os.makedirs(api_dir)
        with open(os.path.join(self.sa, "token"), "w") as f:
            f.write("not-the-token")
        with FakeApiServer(api_dir) as api:
            result = self.run_script(api)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("could not create CertificateRequest stepwatch/stepwatch-agent-gpu-node-7",
                      result.stderr)
        self.assertEqual(os.listdir(self.tls), [])

    def test_a_node_name_that_is_no_dns_name_is_refused(self):
        api_dir = os.path.join(self.tmpdir, "api")
        os.makedirs(api_dir)
        with FakeApiServer(api_dir) as api:
            for node in ('gpu"node', "GPU-Node", "a/b", "-x", "node 1"):
                result = self.run_script(api, node)
                self.assertNotEqual(result.returncode, 0, node)
                self.assertIn("is not a DNS name", result.stderr, node)
            self.assertEqual(api.log, [])

    def test_no_node_name_is_refused(self):
        result = subprocess.run(["/bin/sh", SCRIPT], env={"PATH": "/usr/bin:/bin"},
                                capture_output=True, text=True, timeout=30)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("NODE_NAME", result.stderr)


if __name__ == "__main__":
    unittest.main()
