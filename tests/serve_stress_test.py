#!/usr/bin/env python3
"""petrel serve under hostile load (standard library only): 40 concurrent requests, a 5 MB body, 100,000-deep
nesting, binary garbage, a streaming client that disconnects, a client that stalls mid-request. The server must
answer each with a status (200/400/413), keep serving, and exit 0 on SIGTERM.

Usage: serve_stress_test.py PETREL_BINARY MODEL_DIR
"""
import json, socket, subprocess, re, sys, threading, time, urllib.request, urllib.error
petrel, model = sys.argv[1], sys.argv[2]
proc = subprocess.Popen([petrel, "serve", model, "--port", "0", "-q", "--threads", "1"], stderr=subprocess.PIPE, text=True)
port = None
while port is None:
    m = re.search(r":(\d+)/v1", proc.stderr.readline())
    if m: port = int(m.group(1))
url = f"http://127.0.0.1:{port}/v1/chat/completions"
def post(body, timeout=60):
    req = urllib.request.Request(url, data=body if isinstance(body, bytes) else json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r: return r.status, r.read()
    except urllib.error.HTTPError as e: return e.code, e.read()
    except Exception as e: return -1, repr(e).encode()
codes = {}
lock = threading.Lock()
def one(i):
    s, body = post({"messages": [{"role": "user", "content": f"story {i}"}], "max_tokens": 64, "temperature": 0})
    with lock: codes[s] = codes.get(s, 0) + 1
    if s != 200: print(f"request {i}: {s} {body[:200]!r}")
t0 = time.time()
threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
[t.start() for t in threads]; [t.join() for t in threads]
print("40 concurrent:", codes, f"{time.time()-t0:.1f}s")
failures = [] if codes == {200: 40} else ["concurrent"]
def expect(what, got, want):
    print(what, got)
    if got != want: failures.append(what)
expect("5 MB body:", post(b"{" + b" " * (5 << 20) + b"}")[0], 413)
expect("deep nesting:", post(b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}")[0], 400)
expect("binary garbage:", post(bytes(range(256)) * 100)[0], 400)
# a streaming client that goes away after the first bytes
s = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "stream": True}).encode()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
s.recv(100); s.close()
# a slow client that sends half a request and stalls
s2 = socket.create_connection(("127.0.0.1", port)); s2.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
t0 = time.time()
expect("after disconnect, a request:", post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})[0], 200)
expect("health:", urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status, 200)
s2.close()
proc.terminate(); proc.wait(timeout=20)
expect("exit status:", proc.returncode, 0)
if failures:
    print("FAILED:", failures); sys.exit(1)
print("all passed")
