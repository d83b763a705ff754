#!/usr/bin/env python3
"""A local HTTPS git server for the tests: `git http-backend` behind TLS, on loopback only.

    git_https_server.py --root DIR --cert CERT --key KEY [--log FILE]

Serves every repository under DIR (smart HTTP, protocol v2 included), prints
"PORT <n>" on stdout once it listens on 127.0.0.1:<n> (or --bind ADDR:<n>), and appends one line per request to
--log, so a test can tell whether anything connected. Stops on SIGTERM.
"""

import argparse
import http.server
import os
import signal
import ssl
import subprocess
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        if self.server.log_path:
            with self.server.log_lock, open(self.server.log_path, "a") as f:
                f.write("%s %s\n" % (self.command, self.path))

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def serve(self):
        path, _, query = self.path.partition("?")
        if self.command == "POST" and self.server.slow:
            time.sleep(self.server.slow)
        body = self.read_body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.server.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        proc = subprocess.Popen(
            ["git", "http-backend"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        writer = threading.Thread(target=lambda: (proc.stdin.write(body), proc.stdin.close()))
        writer.start()
        status, headers = 200, []
        while True:
            line = proc.stdout.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            else:
                headers.append((name.strip(), value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = proc.stdout.read1(1 << 16)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        writer.join()
        proc.wait()

    do_GET = serve
    do_POST = serve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--log")
    ap.add_argument("--bind", default="127.0.0.1", help="an address of this machine (default loopback)")
    ap.add_argument("--slow", type=float, default=0, help="seconds to wait before answering a fetch")
    args = ap.parse_args()

    server = http.server.ThreadingHTTPServer((args.bind, 0), Handler)
    server.daemon_threads = True
    server.root = os.path.abspath(args.root)
    server.slow = args.slow
    server.log_path = args.log
    server.log_lock = threading.Lock()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
