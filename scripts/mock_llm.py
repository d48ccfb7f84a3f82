#!/usr/bin/env python3
"""A local mock of an OpenAI-like LLM and embedding endpoint, for the demo and the tests.

Python 3 standard library only. Binds 127.0.0.1; prints `PORT <n>` as its first stdout line.

    scripts/mock_llm.py --port 0 --rate-429 0.1 --rate-500 0.05 --rate-malformed 0.05 --seed 7

Endpoints
  POST /v1/chat/completions  {model, messages: [{role, content}]}
       -> {"choices": [{"message": {"role": "assistant", "content": "<JSON text>"}}],
           "usage": {"prompt_tokens": n, "completion_tokens": m}}
       The content is JSON text derived deterministically from a hash of the prompt (all
       message contents): a prompt that mentions "grade" gets {"grade": 1..5, "reason": …},
       one that mentions "summar" gets {"summary": …} (its last message's first words),
       anything else {"answer": …}.
  POST /v1/embeddings        {input: "text" | ["text", …]}
       -> {"data": [{"index": i, "embedding": [8 floats]}], "usage": {…}}; each vector is a
       hash of its text, so equal texts get equal vectors.
  GET  /healthz              -> 200 ok
  GET  /stats                -> {"requests": {path: n}, "answers": {path: {"200": n, "429": n,
                                 "500": n, "malformed": n, "400": n}}, "total": n}

Faults (POST endpoints): --rate-429 F answers 429 with `Retry-After: 1`, --rate-500 F answers
500, --rate-malformed F (chat only) answers 200 with content that is not JSON. Whether a
request gets a fault is decided by a hash of (seed, path, prompt, how many times this prompt
was asked before), not by arrival order, so a run is reproducible whatever the concurrency.
--faults-max-per-prompt N bounds the injected faults per distinct prompt (default: no
bound), which lets a test prove that a batch settles without exhausting its attempts.

Markers in a prompt force an answer whatever the rates (and do not count against the bound):
"[mock:malformed]" always gets non-JSON content, "[mock:bad-grade]" gets {"grade": 9, …},
"[mock:500]" always gets a 500.

Lifetime: exits after --max-requests N requests (0 = no bound), and by itself after
--idle-exit S seconds without a request (default 600), so a forgotten mock never lingers.
"""

import argparse
import hashlib
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT = "/v1/chat/completions"
EMBED = "/v1/embeddings"
DIMS = 8
MAX_BODY = 16 * 1024 * 1024


def parse_range(text):
    try:
        lo, _, hi = text.partition("-")
        lo = float(lo)
        hi = float(hi) if hi else lo
    except ValueError:
        raise argparse.ArgumentTypeError("want MIN-MAX in milliseconds, e.g. 5-50")
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError("want 0 <= MIN <= MAX")
    return lo, hi


def fraction(text):
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("want a fraction between 0 and 1")
    if not 0 <= f <= 1:
        raise argparse.ArgumentTypeError("want a fraction between 0 and 1")
    return f


def digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


class Mock:
    """State shared by the handler threads (under one lock)."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.requests = {}            # path -> count
        self.answers = {}             # path -> {"200": n, "429": n, ...}
        self.asked = {}               # (path, prompt hash) -> times asked
        self.faults = {}              # (path, prompt hash) -> injected faults
        self.total = 0
        self.last = time.monotonic()
        self.stop = threading.Event()
        self.stop_reason = ""
        self.inflight = 0

    def begin(self):
        with self.lock:
            self.inflight += 1

    def end(self):
        with self.lock:
            self.inflight -= 1
            self.last = time.monotonic()

    def arrive(self, path):
        with self.lock:
            self.total += 1
            self.last = time.monotonic()
            self.requests[path] = self.requests.get(path, 0) + 1
            if self.args.max_requests and self.total >= self.args.max_requests:
                self.stop_reason = "max-requests reached"
                self.stop.set()

    def answered(self, path, what):
        with self.lock:
            per = self.answers.setdefault(path, {})
            per[what] = per.get(what, 0) + 1

    def decide(self, path, key, can_malform):
        """(fault or None, rng): fault is "429", "500" or "malformed"."""
        with self.lock:
            k = self.asked.get((path, key), 0)
            self.asked[(path, key)] = k + 1
        rng = random.Random(digest(self.args.seed, path, key, k))
        u = rng.random()
        a = self.args
        fault = None
        if u < a.rate_429:
            fault = "429"
        elif u < a.rate_429 + a.rate_500:
            fault = "500"
        elif can_malform and u < a.rate_429 + a.rate_500 + a.rate_malformed:
            fault = "malformed"
        if fault and a.faults_max_per_prompt >= 0:
            with self.lock:
                used = self.faults.get((path, key), 0)
                if used >= a.faults_max_per_prompt:
                    fault = None
                else:
                    self.faults[(path, key)] = used + 1
        return fault, rng

    def snapshot(self):
        with self.lock:
            return {"requests": dict(self.requests),
                    "answers": {p: dict(v) for p, v in self.answers.items()},
                    "total": self.total}


def words(text):
    return text.split()


def chat_content(prompt, last):
    h = int.from_bytes(digest("chat", prompt)[:8], "big")
    low = prompt.lower()
    if "[mock:bad-grade]" in low:
        return json.dumps({"grade": 9, "reason": "out of range on purpose"})
    if "grade" in low:
        grade = 1 + h % 5
        reasons = ["unhelpful", "incomplete", "adequate", "helpful", "excellent"]
        return json.dumps({"grade": grade,
                           "reason": "%s answer (mock %016x)" % (reasons[grade - 1], h)})
    if "summar" in low:
        w = words(last)
        return json.dumps({"summary": " ".join(w[:12]) + (" …" if len(w) > 12 else "")},
                          ensure_ascii=False)
    return json.dumps({"answer": "mock answer %016x" % h})


def embedding(text):
    d = digest("embed", text)
    vec = []
    for i in range(DIMS):
        v = int.from_bytes(d[4 * i:4 * i + 4], "big") / 0xFFFFFFFF * 2 - 1
        vec.append(round(v, 6))
    return vec


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-llm/1"
    mock = None  # set in main

    def log_message(self, fmt, *args):
        if self.mock.args.verbose:
            sys.stderr.write("mock_llm: " + (fmt % args) + "\n")

    def send_json(self, status, obj, headers=None):
        body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def path_only(self):
        return self.path.split("?", 1)[0]

    def do_GET(self):
        self.mock.begin()
        try:
            self.get()
        finally:
            self.mock.end()

    def do_POST(self):
        self.mock.begin()
        try:
            self.post()
        finally:
            self.mock.end()

    def get(self):
        path = self.path_only()
        self.mock.arrive(path)
        if path == "/healthz":
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/stats":
            self.send_json(200, self.mock.snapshot())
        else:
            self.send_json(404, {"error": {"message": "no such endpoint: " + path}})

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError("body too large")
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw.decode("utf-8"))

    def bad(self, path, msg):
        self.mock.answered(path, "400")
        self.send_json(400, {"error": {"message": msg, "type": "invalid_request_error"}})

    def post(self):
        path = self.path_only()
        self.mock.arrive(path)
        try:
            req = self.read_json()
        except (ValueError, UnicodeDecodeError) as e:
            # The body may be unread: close instead of reusing the connection.
            self.close_connection = True
            return self.bad(path, "request body is not JSON: %s" % e)
        if path == CHAT:
            return self.chat(path, req)
        if path == EMBED:
            return self.embed(path, req)
        self.send_json(404, {"error": {"message": "no such endpoint: " + path}})

    def delay(self, rng):
        lo, hi = self.mock.args.latency_ms
        if hi > 0:
            time.sleep(rng.uniform(lo, hi) / 1000.0)

    def fault(self, path, fault):
        if fault == "429":
            self.mock.answered(path, "429")
            self.send_json(429, {"error": {"message": "rate limited (mock)", "type": "rate_limit"}},
                           {"Retry-After": "1"})
            return True
        if fault == "500":
            self.mock.answered(path, "500")
            self.send_json(500, {"error": {"message": "internal error (mock)", "type": "server_error"}})
            return True
        return False

    def chat(self, path, req):
        msgs = req.get("messages") if isinstance(req, dict) else None
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            return self.bad(path, "messages must be a non-empty list of {role, content}")
        prompt = "\n".join(m["content"] for m in msgs)
        key = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        fault, rng = self.mock.decide(path, key, can_malform=True)
        low = prompt.lower()
        if "[mock:500]" in low:
            fault = "500"
        elif "[mock:malformed]" in low:
            fault = "malformed"
        self.delay(rng)
        if self.fault(path, fault):
            return
        if fault == "malformed":
            content = "Sure! Here is the grade you asked for: " + str(rng.randint(1, 5))
            self.mock.answered(path, "malformed")
        else:
            content = chat_content(prompt, msgs[-1]["content"])
            self.mock.answered(path, "200")
        self.send_json(200, {
            "id": "mock-" + key[:16],
            "object": "chat.completion",
            "model": req.get("model") or "mock",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(words(prompt)),
                      "completion_tokens": len(words(content))},
        })

    def embed(self, path, req):
        inp = req.get("input") if isinstance(req, dict) else None
        if isinstance(inp, str):
            inp = [inp]
        if not isinstance(inp, list) or not all(isinstance(s, str) for s in inp):
            return self.bad(path, "input must be a string or a list of strings")
        key = hashlib.sha256("\x00".join(inp).encode("utf-8", "surrogatepass")).hexdigest()
        fault, rng = self.mock.decide(path, key, can_malform=False)
        self.delay(rng)
        if self.fault(path, fault):
            return
        self.mock.answered(path, "200")
        self.send_json(200, {
            "object": "list",
            "model": req.get("model") or "mock-embedding",
            "data": [{"object": "embedding", "index": i, "embedding": embedding(s)}
                     for i, s in enumerate(inp)],
            "usage": {"prompt_tokens": sum(len(words(s)) for s in inp),
                      "total_tokens": sum(len(words(s)) for s in inp)},
        })


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    ap.add_argument("--latency-ms", type=parse_range, default=(0.0, 0.0), metavar="MIN-MAX")
    ap.add_argument("--rate-429", type=fraction, default=0.0, metavar="F")
    ap.add_argument("--rate-500", type=fraction, default=0.0, metavar="F")
    ap.add_argument("--rate-malformed", type=fraction, default=0.0, metavar="F")
    ap.add_argument("--faults-max-per-prompt", type=int, default=-1, metavar="N",
                    help="at most N injected faults per distinct prompt (default: no bound)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-requests", type=int, default=0, metavar="N",
                    help="exit after N requests (0 = no bound)")
    ap.add_argument("--idle-exit", type=float, default=600.0, metavar="S",
                    help="exit after S seconds without a request (default 600)")
    ap.add_argument("--verbose", action="store_true", help="log every request on stderr")
    args = ap.parse_args()
    if args.rate_429 + args.rate_500 + args.rate_malformed > 1:
        ap.error("the fault rates add up to more than 1")
    if args.idle_exit <= 0:
        ap.error("--idle-exit must be > 0")

    mock = Mock(args)
    Handler.mock = mock
    srv = Server(("127.0.0.1", args.port), Handler)
    print("PORT %d" % srv.server_address[1], flush=True)

    def watchdog():
        while not mock.stop.wait(0.2):
            with mock.lock:
                idle = time.monotonic() - mock.last if mock.inflight == 0 else 0
            if idle >= args.idle_exit:
                mock.stop_reason = "idle for %gs" % args.idle_exit
                mock.stop.set()
        srv.shutdown()

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        mock.stop_reason = "interrupted"
    finally:
        # Let requests in flight (the last one of --max-requests included) finish.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with mock.lock:
                if mock.inflight == 0:
                    break
            time.sleep(0.02)
        srv.server_close()
    sys.stderr.write("mock_llm: exiting (%s); %s\n"
                     % (mock.stop_reason or "stopped", json.dumps(mock.snapshot())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
