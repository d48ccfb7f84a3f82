#!/usr/bin/env python3
"""A local mock of OpenAI- and Anthropic-shaped LLM endpoints, for the demo, the tests and the bench.

Python 3 standard library only. Binds 127.0.0.1; prints `PORT <n>` as its first stdout line.

    scripts/mock_llm.py --port 0 --rate-429 0.1 --rate-500 0.05 --rate-malformed 0.05 --seed 7
    scripts/mock_llm.py --port 0 --rpm 300 --tpm 100000 --outage 120+600 --outage-retry-after 60

Endpoints
  POST /v1/chat/completions  (OpenAI) {model, messages: [{role, content}]}
       -> {"choices": [{"message": {"role": "assistant", "content": "<JSON text>"}}],
           "usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}}
       The content is JSON text derived deterministically from a hash of the prompt (all
       message contents): a prompt that mentions "grade" gets {"grade": 1..5, "reason": …},
       one that mentions "summar" gets {"summary": …} (its last message's first words),
       anything else {"answer": …}.
  POST /v1/messages          (Anthropic) {model, max_tokens, system?, messages: [{role,
       content: "text" | [{type: "text", text}]}]}
       -> {"type": "message", "content": [{"type": "text", "text": "<JSON text>"}],
           "usage": {"input_tokens": n, "output_tokens": m}}; the same content as chat.
  POST /v1/embeddings        (OpenAI) {input: "text" | ["text", …]}
       -> {"data": [{"index": i, "embedding": [8 floats]}], "usage": {…}}; each vector is a
       hash of its text, so equal texts get equal vectors.
  GET  /healthz              -> 200 ok
  GET  /stats, GET /_stats   -> what the mock saw (below); /_stats and /_control are out of
                                band: never limited, refused or counted as requests.
  POST /_control             -> change the run at run time (below); answers the new state.

Tokens: a text is (UTF-8 bytes + 3) // 4 tokens, so a test can predict every count. The
prompt is the message contents joined by "\n" (Anthropic: the system text first); the
completion is the answer's content. Embeddings: the inputs' tokens, no completion.

Global limits (--rpm N, --tpm N; 0 = none) hold for all clients together, over a sliding
window of --window-s seconds (default 60): a request is admitted only if the requests
admitted in the last window number fewer than --rpm and their tokens plus this request's
stay within --tpm. A request is charged its prompt tokens plus the completion tokens of
its well-formed answer, when it is admitted. One refused gets 429 with Retry-After: the
whole seconds (at least 1) until enough of the window ages out for it. One that could never
fit (more tokens than --tpm) gets 400. Admitted requests that then get an injected fault
still count. Every answer of a limited endpoint carries the headers of its shape:
  OpenAI:    x-ratelimit-limit-requests, x-ratelimit-remaining-requests,
             x-ratelimit-reset-requests ("1s", "250ms", "6m0s"), and the same for -tokens;
  Anthropic: anthropic-ratelimit-requests-limit, -remaining, -reset (RFC 3339, UTC), and the
             same for tokens; retry-after on a 429.
A reset is the time until the oldest request (or tokens) in the window ages out, i.e. when
remaining next rises ("0s", or now, when the window is empty). Providers document theirs as
"until fully replenished"; under a sliding window that is always about the window's length,
which tells a client nothing about when it may send again.

Outages: every request to a model endpoint is refused for a while: 429 with Retry-After
(--outage-retry-after N; default the seconds left in the outage) or 503
(--outage-status 503, also with Retry-After). --outage START+DURATION (seconds after the
mock starts; repeatable) plans one at start; POST /_control {"outage_s": 600,
"retry_after": 60, "status": 429} starts one now ({"outage_s": 0} ends it). An outage
covers every model endpoint, or only those named by --outage-path PATH (repeatable) or
"paths": [...] in /_control ([] = all again): one provider down while another flows. Refused
requests are not charged to the limits and draw no fault.

--retry-after-format seconds|date|none: Retry-After as whole seconds (default), as an
HTTP-date (RFC 9110: "Tue, 01 Dec 2026 16:45:03 GMT", rounded up to the next whole second
so a client never comes back early), or left out (the client must read the reset headers).

/_control takes any of: outage_s, retry_after, status (429 or 503), paths, rpm, tpm,
retry_after_format. Unknown keys or bad values get 400 and change nothing.

/stats and /_stats: {"requests": {path: n}, "answers": {path: {"200": n, "429": n, "500": n,
"503": n, "malformed": n, "400": n}}, "total": n} as before, plus "admitted" (requests past
the outage and the limits), "limited": {"requests": n, "tokens": n} (429s of the limits, by
what ran out), "outage_refused", "tokens": {"prompt", "completion", "total"} (usage sent in
200 answers), "charged_tokens", "window": {"seconds", "requests", "tokens", "max_requests",
"max_tokens"} (now, and the most ever held), "limits": {"rpm", "tpm"}, "outage": {"active",
"remaining_s"}, "uptime_s" and "per_minute": [{"minute": i, "requests", "admitted", "ok",
"429", "503", "tokens"}] (model endpoints, by whole minute since the start).

Faults (POST endpoints): --rate-429 F answers 429 with `Retry-After: 1`, --rate-500 F answers
500, --rate-malformed F (chat and messages) answers 200 with content that is not JSON.
Whether a request gets a fault is decided by a hash of (seed, path, prompt, how many times
this prompt was asked before), not by arrival order, so a run is reproducible whatever the
concurrency. --faults-max-per-prompt N bounds the injected faults per distinct prompt
(default: no bound), which lets a test prove that a batch settles without exhausting its
attempts.

Markers in a prompt force an answer whatever the rates (and do not count against the bound):
"[mock:malformed]" always gets non-JSON content, "[mock:bad-grade]" gets {"grade": 9, …},
"[mock:500]" always gets a 500.

Lifetime: exits after --max-requests N requests (0 = no bound), and by itself after
--idle-exit S seconds without a request (default 600), so a forgotten mock never lingers.
"""

import argparse
import collections
import email.utils
import hashlib
import json
import math
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
EMBED = "/v1/embeddings"
MODEL_PATHS = (CHAT, MESSAGES, EMBED)
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


def count(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("want a whole number >= 0")
    if n < 0:
        raise argparse.ArgumentTypeError("want a whole number >= 0")
    return n


def seconds(text):
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("want a number of seconds")
    if not math.isfinite(f) or f <= 0:
        raise argparse.ArgumentTypeError("want a number of seconds above zero")
    return f


def outage_window(text):
    """START+DURATION in seconds after the mock starts, e.g. 120+600."""
    start, plus, dur = text.partition("+")
    try:
        start, dur = float(start), float(dur)
    except ValueError:
        raise argparse.ArgumentTypeError("want START+DURATION in seconds, e.g. 120+600")
    if not plus or not (math.isfinite(start) and math.isfinite(dur)) or start < 0 or dur <= 0:
        raise argparse.ArgumentTypeError("want START >= 0 and DURATION > 0, e.g. 120+600")
    return start, dur


def digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def tokens(text):
    """The mock's tokenizer: four UTF-8 bytes a token, rounded up."""
    return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4


def go_duration(s):
    """A duration as OpenAI writes its resets (Go's time.Duration): 0s, 250ms, 1.5s, 6m0s."""
    if s <= 0:
        return "0s"
    if s < 1:
        return "%dms" % max(1, round(s * 1000))
    s = round(s, 3)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    sec = ("%.3f" % sec).rstrip("0").rstrip(".")
    if h:
        return "%dh%dm%ss" % (h, m, sec)
    if m:
        return "%dm%ss" % (m, sec)
    return "%ss" % sec


def rfc3339(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(epoch)))


class Limiter:
    """Requests and tokens admitted over the last `window` seconds (a sliding log), for all
    clients together. Not locked: the Mock's lock covers it."""

    def __init__(self, rpm, tpm, window):
        self.rpm, self.tpm, self.window = rpm, tpm, window
        self.log = collections.deque()   # (monotonic time, tokens), oldest first
        self.tokens = 0
        self.max_requests = 0
        self.max_tokens = 0

    def expire(self, now):
        while self.log and self.log[0][0] <= now - self.window:
            self.tokens -= self.log.popleft()[1]

    def reset_in(self, now):
        """Seconds until the oldest entry ages out (remaining next rises); 0 when empty."""
        return max(0.0, self.log[0][0] + self.window - now) if self.log else 0.0

    def wait_for_tokens(self, now, need):
        """Seconds until the window holds at most tpm - need tokens."""
        excess = self.tokens + need - self.tpm
        for t, n in self.log:
            excess -= n
            if excess <= 0:
                return max(0.0, t + self.window - now)
        return self.window

    def admit(self, now, need):
        """(None, 0) when admitted (and charged), else ("requests" | "tokens" | "too_large",
        seconds until it would fit)."""
        self.expire(now)
        if self.tpm and need > self.tpm:
            return "too_large", 0.0
        if self.rpm and len(self.log) >= self.rpm:
            return "requests", self.reset_in(now)
        if self.tpm and self.tokens + need > self.tpm:
            return "tokens", self.wait_for_tokens(now, need)
        self.log.append((now, need))
        self.tokens += need
        self.max_requests = max(self.max_requests, len(self.log))
        self.max_tokens = max(self.max_tokens, self.tokens)
        return None, 0.0

    def state(self, now):
        reset = self.reset_in(now)
        return {"rpm": self.rpm, "tpm": self.tpm,
                "remaining_requests": max(0, self.rpm - len(self.log)),
                "remaining_tokens": max(0, self.tpm - self.tokens),
                "reset": reset}


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
        self.started = time.monotonic()
        self.last = self.started
        self.stop = threading.Event()
        self.stop_reason = ""
        self.inflight = 0
        self.limiter = Limiter(args.rpm, args.tpm, args.window_s)
        # [start, end) in monotonic seconds
        self.outages = [[self.started + a, self.started + a + d] for a, d in args.outage]
        self.outage_retry_after = args.outage_retry_after
        self.outage_status = args.outage_status
        self.outage_paths = set(args.outage_path)   # empty: every model endpoint
        self.retry_after_format = args.retry_after_format
        self.admitted = 0
        self.limited = {"requests": 0, "tokens": 0}
        self.outage_refused = 0
        self.usage = {"prompt": 0, "completion": 0, "total": 0}
        self.charged = 0
        self.minutes = {}             # whole minute since start -> figures

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
            if path in MODEL_PATHS:
                self.minute()["requests"] += 1
            if self.args.max_requests and self.total >= self.args.max_requests:
                self.stop_reason = "max-requests reached"
                self.stop.set()

    def minute(self):
        """This minute's figures (caller holds the lock)."""
        k = int((time.monotonic() - self.started) // 60)
        m = self.minutes.get(k)
        if m is None:
            m = self.minutes[k] = {"minute": k, "requests": 0, "admitted": 0, "ok": 0,
                                   "429": 0, "503": 0, "tokens": 0}
        return m

    def answered(self, path, what):
        with self.lock:
            per = self.answers.setdefault(path, {})
            per[what] = per.get(what, 0) + 1
            if path in MODEL_PATHS:
                m = self.minute()
                if what in ("200", "malformed"):
                    m["ok"] += 1
                elif what in ("429", "503"):
                    m[what] += 1

    def outage_left(self, now):
        """Seconds left in the outage now under way, or 0 (caller holds the lock)."""
        return max([e - now for s, e in self.outages if s <= now < e] or [0.0])

    def gate(self, path, need):
        """Outage, then the limits, for one request that costs `need` tokens. Returns
        (refusal or None, limiter state, retry-after seconds); refusal is "outage", "requests",
        "tokens" or "too_large"."""
        with self.lock:
            now = time.monotonic()
            left = self.outage_left(now)
            if left > 0 and (not self.outage_paths or path in self.outage_paths):
                self.outage_refused += 1
                ra = self.outage_retry_after if self.outage_retry_after is not None else left
                return "outage", self.limiter.state(now), ra
            why, wait = self.limiter.admit(now, need)
            if why in ("requests", "tokens"):
                self.limited[why] += 1
            elif why is None:
                self.admitted += 1
                self.charged += need
                m = self.minute()
                m["admitted"] += 1
                m["tokens"] += need
            return why, self.limiter.state(now), wait

    def used(self, prompt, completion):
        with self.lock:
            self.usage["prompt"] += prompt
            self.usage["completion"] += completion
            self.usage["total"] += prompt + completion

    def control(self, req):
        """Applies a /_control request (all or nothing); returns an error text or None."""
        if not isinstance(req, dict):
            return "want a JSON object"
        known = {"outage_s", "retry_after", "status", "paths", "rpm", "tpm", "retry_after_format"}
        bad = sorted(set(req) - known)
        if bad:
            return "unknown keys: " + ", ".join(bad)

        def number(k, lo, whole=False):
            v = req[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < lo or (whole and v != int(v)):
                raise ValueError("%s must be a %s >= %g" % (k, "whole number" if whole else "number", lo))
            return int(v) if whole else float(v)
        try:
            outage = number("outage_s", 0) if "outage_s" in req else None
            ra = number("retry_after", 0) if "retry_after" in req else None
            rpm = number("rpm", 0, True) if "rpm" in req else None
            tpm = number("tpm", 0, True) if "tpm" in req else None
        except ValueError as e:
            return str(e)
        status = req.get("status")
        if status is not None and status not in (429, 503):
            return "status must be 429 or 503"
        paths = req.get("paths")
        if paths is not None and (not isinstance(paths, list) or
                                  any(p not in MODEL_PATHS for p in paths)):
            return "paths must be a list of " + ", ".join(MODEL_PATHS)
        fmt = req.get("retry_after_format")
        if fmt is not None and fmt not in ("seconds", "date", "none"):
            return "retry_after_format must be seconds, date or none"
        with self.lock:
            now = time.monotonic()
            if outage is not None:
                # End what is under way, then (outage_s > 0) start a new one now.
                for w in self.outages:
                    if w[0] <= now < w[1]:
                        w[1] = now
                if outage > 0:
                    self.outages.append([now, now + outage])
                # A retry_after given with the outage is its own; without one, the time left.
                self.outage_retry_after = ra
            elif ra is not None:
                self.outage_retry_after = ra
            if status is not None:
                self.outage_status = status
            if paths is not None:
                self.outage_paths = set(paths)
            if rpm is not None:
                self.limiter.rpm = rpm
            if tpm is not None:
                self.limiter.tpm = tpm
            if fmt is not None:
                self.retry_after_format = fmt
        return None

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
            now = time.monotonic()
            self.limiter.expire(now)
            left = self.outage_left(now)
            return {"requests": dict(self.requests),
                    "answers": {p: dict(v) for p, v in self.answers.items()},
                    "total": self.total,
                    "admitted": self.admitted,
                    "limited": dict(self.limited),
                    "outage_refused": self.outage_refused,
                    "tokens": dict(self.usage),
                    "charged_tokens": self.charged,
                    "window": {"seconds": self.limiter.window,
                               "requests": len(self.limiter.log),
                               "tokens": self.limiter.tokens,
                               "max_requests": self.limiter.max_requests,
                               "max_tokens": self.limiter.max_tokens},
                    "limits": {"rpm": self.limiter.rpm, "tpm": self.limiter.tpm},
                    "outage": {"active": left > 0, "remaining_s": round(left, 3),
                               "status": self.outage_status,
                               "retry_after": self.outage_retry_after,
                               "paths": sorted(self.outage_paths)},
                    "retry_after_format": self.retry_after_format,
                    "uptime_s": round(now - self.started, 3),
                    "per_minute": [dict(self.minutes[k]) for k in sorted(self.minutes)]}


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


def anthropic_text(content):
    """The text of an Anthropic content value (a string or text blocks), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in content):
        return "\n".join(b["text"] for b in content)
    return None


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
        if path == "/_stats":
            return self.send_json(200, self.mock.snapshot())
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

    def error_body(self, path, kind, msg):
        if path == MESSAGES:
            return {"type": "error", "error": {"type": kind, "message": msg}}
        return {"error": {"message": msg, "type": kind}}

    def bad(self, path, msg):
        self.mock.answered(path, "400")
        self.send_json(400, self.error_body(path, "invalid_request_error", msg))

    def post(self):
        path = self.path_only()
        if path == "/_control":
            try:
                req = self.read_json()
            except (ValueError, UnicodeDecodeError) as e:
                self.close_connection = True
                return self.send_json(400, {"error": {"message": "request body is not JSON: %s" % e}})
            err = self.mock.control(req)
            if err:
                return self.send_json(400, {"error": {"message": err}})
            return self.send_json(200, self.mock.snapshot())
        self.mock.arrive(path)
        try:
            req = self.read_json()
        except (ValueError, UnicodeDecodeError) as e:
            # The body may be unread: close instead of reusing the connection.
            self.close_connection = True
            return self.bad(path, "request body is not JSON: %s" % e)
        if path == CHAT:
            return self.chat(path, req)
        if path == MESSAGES:
            return self.messages(path, req)
        if path == EMBED:
            return self.embed(path, req)
        self.send_json(404, {"error": {"message": "no such endpoint: " + path}})

    def delay(self, rng):
        lo, hi = self.mock.args.latency_ms
        if hi > 0:
            time.sleep(rng.uniform(lo, hi) / 1000.0)

    def retry_after(self, secs):
        """{"Retry-After": …} in the configured format (none: {})."""
        fmt = self.mock.retry_after_format
        if fmt == "none":
            return {}
        if fmt == "date":
            return {"Retry-After": email.utils.formatdate(math.ceil(time.time() + secs), usegmt=True)}
        return {"Retry-After": str(max(1, math.ceil(secs)))}

    def limit_headers(self, path, st):
        """The rate-limit headers of the endpoint's shape, for the limits that are set."""
        h = {}
        anthropic = path == MESSAGES
        reset_at = rfc3339(time.time() + st["reset"])
        for what, limit, left in (("requests", st["rpm"], st["remaining_requests"]),
                                  ("tokens", st["tpm"], st["remaining_tokens"])):
            if not limit:
                continue
            if anthropic:
                h["anthropic-ratelimit-%s-limit" % what] = str(limit)
                h["anthropic-ratelimit-%s-remaining" % what] = str(left)
                h["anthropic-ratelimit-%s-reset" % what] = reset_at
            else:
                h["x-ratelimit-limit-%s" % what] = str(limit)
                h["x-ratelimit-remaining-%s" % what] = str(left)
                h["x-ratelimit-reset-%s" % what] = go_duration(st["reset"])
        return h

    def admit(self, path, need):
        """Outage and limits; answers a refusal itself. Returns the headers for the answer,
        or None when the request was refused."""
        why, st, wait = self.mock.gate(path, need)
        headers = self.limit_headers(path, st)
        if why is None:
            return headers
        if why == "too_large":
            self.bad(path, "request needs %d tokens, more than the limit of %d per %gs window"
                     % (need, st["tpm"], self.mock.limiter.window))
            return None
        headers.update(self.retry_after(wait))
        if path == MESSAGES and "Retry-After" in headers:
            headers["retry-after"] = headers.pop("Retry-After")
        if why == "outage":
            status = self.mock.outage_status
            self.mock.answered(path, str(status))
            kind = ("rate_limit_error" if path == MESSAGES else "rate_limit") if status == 429 \
                else ("overloaded_error" if path == MESSAGES else "server_error")
            self.send_json(status, self.error_body(path, kind, "outage (mock)"), headers)
            return None
        self.mock.answered(path, "429")
        self.send_json(429, self.error_body(
            path, "rate_limit_error" if path == MESSAGES else "rate_limit",
            "rate limit reached for %s (mock: %d requests, %d tokens per %gs)"
            % (why, st["rpm"], st["tpm"], self.mock.limiter.window)), headers)
        return None

    def fault(self, path, fault, headers):
        if fault == "429":
            self.mock.answered(path, "429")
            h = dict(headers)
            h.update(self.retry_after(1))
            kind = "rate_limit_error" if path == MESSAGES else "rate_limit"
            if path == MESSAGES:
                h["retry-after"] = h.pop("Retry-After", None) or ""
                if not h["retry-after"]:
                    del h["retry-after"]
            self.send_json(429, self.error_body(path, kind, "rate limited (mock)"), h)
            return True
        if fault == "500":
            self.mock.answered(path, "500")
            kind = "api_error" if path == MESSAGES else "server_error"
            self.send_json(500, self.error_body(path, kind, "internal error (mock)"), headers)
            return True
        return False

    def answer_text(self, path, key, prompt, last, need_prompt):
        """The shared part of chat and messages: gate, fault, content. Returns (content,
        headers) or None when the request has been answered already."""
        low = prompt.lower()
        content = chat_content(prompt, last)
        headers = self.admit(path, need_prompt + tokens(content))
        if headers is None:
            return None
        fault, rng = self.mock.decide(path, key, can_malform=True)
        if "[mock:500]" in low:
            fault = "500"
        elif "[mock:malformed]" in low:
            fault = "malformed"
        self.delay(rng)
        if self.fault(path, fault, headers):
            return None
        if fault == "malformed":
            content = "Sure! Here is the grade you asked for: " + str(rng.randint(1, 5))
            self.mock.answered(path, "malformed")
        else:
            self.mock.answered(path, "200")
        self.mock.used(need_prompt, tokens(content))
        return content, headers

    def chat(self, path, req):
        msgs = req.get("messages") if isinstance(req, dict) else None
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            return self.bad(path, "messages must be a non-empty list of {role, content}")
        prompt = "\n".join(m["content"] for m in msgs)
        key = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        pt = tokens(prompt)
        got = self.answer_text(path, key, prompt, msgs[-1]["content"], pt)
        if got is None:
            return
        content, headers = got
        ct = tokens(content)
        self.send_json(200, {
            "id": "mock-" + key[:16],
            "object": "chat.completion",
            "model": req.get("model") or "mock",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        }, headers)

    def messages(self, path, req):
        msgs = req.get("messages") if isinstance(req, dict) else None
        texts = [anthropic_text(m.get("content")) if isinstance(m, dict) else None
                 for m in msgs] if isinstance(msgs, list) else []
        if not texts or any(t is None for t in texts):
            return self.bad(path, "messages must be a non-empty list of {role, content}, "
                            "content a string or text blocks")
        system = req.get("system")
        if system is not None:
            system = anthropic_text(system)
            if system is None:
                return self.bad(path, "system must be a string or text blocks")
        prompt = "\n".join(([system] if system is not None else []) + texts)
        key = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        it = tokens(prompt)
        got = self.answer_text(path, key, prompt, texts[-1], it)
        if got is None:
            return
        content, headers = got
        self.send_json(200, {
            "id": "msg_mock" + key[:16],
            "type": "message",
            "role": "assistant",
            "model": req.get("model") or "mock",
            "content": [{"type": "text", "text": content}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": it, "output_tokens": tokens(content)},
        }, headers)

    def embed(self, path, req):
        inp = req.get("input") if isinstance(req, dict) else None
        if isinstance(inp, str):
            inp = [inp]
        if not isinstance(inp, list) or not all(isinstance(s, str) for s in inp):
            return self.bad(path, "input must be a string or a list of strings")
        key = hashlib.sha256("\x00".join(inp).encode("utf-8", "surrogatepass")).hexdigest()
        pt = sum(tokens(s) for s in inp)
        headers = self.admit(path, pt)
        if headers is None:
            return
        fault, rng = self.mock.decide(path, key, can_malform=False)
        self.delay(rng)
        if self.fault(path, fault, headers):
            return
        self.mock.answered(path, "200")
        self.mock.used(pt, 0)
        self.send_json(200, {
            "object": "list",
            "model": req.get("model") or "mock-embedding",
            "data": [{"object": "embedding", "index": i, "embedding": embedding(s)}
                     for i, s in enumerate(inp)],
            "usage": {"prompt_tokens": pt, "total_tokens": pt},
        }, headers)


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
    ap.add_argument("--rpm", type=count, default=0, metavar="N",
                    help="requests admitted per window, all clients together (0 = no limit)")
    ap.add_argument("--tpm", type=count, default=0, metavar="N",
                    help="tokens admitted per window, all clients together (0 = no limit)")
    ap.add_argument("--window-s", type=seconds, default=60.0, metavar="S",
                    help="the limits' sliding window (default 60; tests shorten it)")
    ap.add_argument("--outage", type=outage_window, action="append", default=[],
                    metavar="START+DURATION",
                    help="refuse every model request from START to START+DURATION seconds "
                         "after the start (repeatable)")
    ap.add_argument("--outage-retry-after", type=count, default=None, metavar="N",
                    help="Retry-After of outage refusals (default: the seconds left)")
    ap.add_argument("--outage-status", type=int, choices=(429, 503), default=429)
    ap.add_argument("--outage-path", choices=MODEL_PATHS, action="append", default=[],
                    help="outages cover only this endpoint (repeatable; default all)")
    ap.add_argument("--retry-after-format", choices=("seconds", "date", "none"),
                    default="seconds")
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
    snap = mock.snapshot()
    del snap["per_minute"]
    sys.stderr.write("mock_llm: exiting (%s); %s\n"
                     % (mock.stop_reason or "stopped", json.dumps(snap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
