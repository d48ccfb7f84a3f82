#!/usr/bin/env python3
"""A local mock of OpenAI- and Anthropic-shaped LLM endpoints, for the demo, the tests and the bench.

Python 3 standard library only. Binds 127.0.0.1; prints `PORT <n>` as its first stdout line.

    scripts/mock_llm.py --port 0 --rate-429 0.1 --rate-500 0.05 --rate-malformed 0.05 --seed 7
    scripts/mock_llm.py --port 0 --rpm 300 --tpm 100000 --outage 120+600 --outage-retry-after 60
    scripts/mock_llm.py --port 0 --batch-delay-s 30 --batch-fail-rate 0.1 --seed 3

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

Provider batches (OpenAI's Files + Batch API, Anthropic's Message Batches)
  Shaped like the real ones; each item answers exactly what the synchronous endpoint answers
  for its body (content, id, usage and token counts), so a client can compare the two.
  None of them passes the --rpm/--tpm limits, the outages or the --rate-* faults (providers
  limit batches apart; --batch-refuse below is their own fault), and their usage is counted
  in "batches" of /stats, not in "tokens".

  OpenAI
  POST /v1/files             multipart/form-data, fields purpose=batch and file (JSONL, one
       request a line: {"custom_id", "method": "POST", "url": "/v1/chat/completions",
       "body": {...a chat request...}}; blank lines are skipped; other fields are ignored)
       -> {"id": "file-<hex>", "object": "file", "bytes", "created_at", "filename",
           "purpose": "batch", "status": "processed", "status_details": null}
       400 (OpenAI's error shape, the line named) for a body that is not well-formed
       multipart, a purpose other than batch, no file field, a file that is not UTF-8 or
       holds no request, a line that is not a JSON object, a custom_id that is not a
       non-empty string or is used twice, a method other than POST, another url, a body
       that is not an object. A 400 keeps nothing. Bodies (of every endpoint) may come by
       Content-Length or chunked, after "Expect: 100-continue" or not, as libcurl sends them.
  POST /v1/batches           {"input_file_id", "endpoint": "/v1/chat/completions",
       "completion_window": "24h", "metadata"?: up to 16 string pairs} (other keys: 400;
       an unknown file or one that is not purpose=batch: 400)
       -> the batch: {"id": "batch_<hex>", "object": "batch", "endpoint", "errors",
          "input_file_id", "completion_window", "status", "output_file_id", "error_file_id",
          "created_at", "in_progress_at", "expires_at" (created_at + 24 h), "finalizing_at",
          "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at",
          "request_counts": {"total", "completed", "failed"}, "metadata"} (unix seconds)
  GET  /v1/batches/{id}      -> the batch now; GET /v1/batches lists them, newest first.
       status: validating for the first 10 % of the delay, in_progress to 90 % (items are
       done one after another, in file order, and counted as they are), finalizing, then
       completed at the delay. Also: "expired" (--batch-expire), "cancelling" then
       "cancelled" (below), and "failed" at the end of validating when the file's requests
       name more than one model (errors: {"object": "list", "data": [{"code":
       "mismatched_model", "param": "body.model", "line", "message"}]}; no files, counts 0).
       Once ended, request_counts.completed is the items answered 200 and failed all the
       others (failed, invalid, expired, cancelled): total = completed + failed.
  GET  /v1/files/{id}/content -> the file's bytes (GET /v1/files/{id}: its object).
       output_file_id (null when no item succeeded) holds a line per answered item:
         {"id": "batch_req_<hex>", "custom_id", "response": {"status_code": 200,
          "request_id": "req_<hex>", "body": <the chat completion>}, "error": null}
       error_file_id (null when none) holds the others:
         failed:  "response": {"status_code": 500, "request_id", "body": {"error":
                  {"message", "type": "server_error", "param": null, "code": null}}}
         invalid: the same with 400 and "invalid_request_error" (a body the synchronous
                  endpoint would refuse, e.g. no messages; decided per item, as the real one)
         expired: "response": null, "error": {"code": "batch_expired", "message"}
         cancelled: "response": null, "error": {"code": "batch_cancelled", "message"}
       Lines keep the input file's order, unless --batch-shuffle (below).
  POST /v1/batches/{id}/cancel -> the batch, "cancelling"; it is "cancelled" min(1 s,
       delay / 10) later. Items done before the cancel keep their answers; the rest are
       cancelled. Again while cancelling: the same answer; once ended: 409.

  Anthropic
  POST /v1/messages/batches  {"requests": [{"custom_id", "params": {...a /v1/messages
       request...}}]} (custom_id 1-64 of a-z A-Z 0-9 _ -, unique; anything else in the
       body or a request: 400 in Anthropic's shape, nothing kept)
       -> {"id": "msgbatch_<hex>", "type": "message_batch", "processing_status":
           "in_progress", "request_counts": {"processing", "succeeded", "errored",
           "canceled", "expired"}, "ended_at": null, "created_at", "expires_at",
           "archived_at": null, "cancel_initiated_at": null, "results_url": null}
           (times in RFC 3339 with microseconds, as Anthropic writes them)
  GET  /v1/messages/batches/{id} -> processing_status "ended" after the delay, ended_at and
       results_url = http://127.0.0.1:<port>/v1/messages/batches/{id}/results; counts
       move from processing as items are done. GET /v1/messages/batches lists them.
  GET  /v1/messages/batches/{id}/results -> JSONL in request order unless --batch-shuffle
       (the real one promises no order; match on custom_id): {"custom_id", "result": R}:
         {"type": "succeeded", "message": <the message /v1/messages gives>}
         {"type": "errored", "error": {"type": "error", "error": {"type": "api_error"
          (failed) | "invalid_request_error" (params /v1/messages would refuse), "message"}}}
         {"type": "expired"}, {"type": "canceled"}
       Before the end: 409.
  POST /v1/messages/batches/{id}/cancel -> "canceling", then "ended" as OpenAI's above.
  Unknown ids (or the other provider's): 404 in the endpoint's shape.

  Knobs, for batches created after they are set (one under way keeps its own):
  --batch-delay-s S (default 2; 0 ends a batch at once): creation to the end.
  --batch-fail-rate F (default 0): the share of items that fail, drawn by a hash of (seed,
       custom_id, how many times that custom_id was in a batch of that provider before):
       the same items fail on every run with the same seed, and an item sent again in a
       new batch draws again, so a per-item retry can succeed.
  --batch-expire: batches expire at the delay instead of completing; --batch-expire-done F
       (default 0.5): the first floor(F * items) in order are done first, the rest expire.
  POST /_control takes batch_delay_s, batch_fail_rate, batch_expire (true/false),
       batch_expire_done, batch_shuffle, batch_refuse and batch_refuse_status, all or
       nothing as the other keys.
  --batch-shuffle (or "batch_shuffle": true): the lines of output and error files and of
       results come in an order of their own (a hash of seed, batch id and custom_id), as
       neither provider promises an order: proves that a client matches on custom_id.
  --batch-refuse N (or "batch_refuse": N in /_control): the next N requests to any batch
       endpoint (uploads, creates, GETs, cancels, results; either provider) are refused
       with --batch-refuse-status (or "batch_refuse_status") 500 (default), 429 or 503 (the
       last two with retry-after: 1), in the endpoint's error shape, and change nothing:
       a client's retries of submission and polling can be tested. The only fault that
       batch endpoints ever get.
  Markers work in batch items too: "[mock:500]" fails the item, "[mock:malformed]" gives it
  non-JSON content.

  /stats "batches": {"created", "completed", "expired", "cancelled", "failed" (at
  validation), "items" (at creation), "items_succeeded", "items_failed" (failed and invalid),
  "items_expired", "items_cancelled" (counted when a batch ends), "live" (not ended yet),
  "files" (kept), "refused" (by --batch-refuse), "tokens": {"prompt", "completion",
  "total"} (of succeeded items), "by_provider": {"openai": {the counts above from "created"
  to "items_cancelled", and "tokens"}, "anthropic": {...}}, "settings": {the knobs now;
  batch_refuse is the refusals left}}. Batch requests are counted under "requests" and
  "answers" by path, ids replaced by {id}: "/v1/batches/{id}", "/v1/files/{id}/content", ...
  A batch moves on when anything looks at it (a GET, /stats, or the watchdog every 0.2 s).

Lifetime: exits after --max-requests N requests (0 = no bound), and by itself after
--idle-exit S seconds without a request (default 600), so a forgotten mock never lingers.
"""

import argparse
import collections
import email.message
import email.utils
import hashlib
import json
import math
import random
import re
import sys
import threading
import time
import urllib.parse
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


def delay_seconds(text):
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("want a number of seconds")
    if not math.isfinite(f) or f < 0:
        raise argparse.ArgumentTypeError("want a number of seconds >= 0")
    return f


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
        self.batches = Batches(args)

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
        known = {"outage_s", "retry_after", "status", "paths", "rpm", "tpm", "retry_after_format",
                 "batch_delay_s", "batch_fail_rate", "batch_expire", "batch_expire_done",
                 "batch_refuse", "batch_refuse_status", "batch_shuffle"}
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
            bdelay = number("batch_delay_s", 0) if "batch_delay_s" in req else None
            brate = number("batch_fail_rate", 0) if "batch_fail_rate" in req else None
            bdone = number("batch_expire_done", 0) if "batch_expire_done" in req else None
            brefuse = number("batch_refuse", 0, True) if "batch_refuse" in req else None
        except ValueError as e:
            return str(e)
        for k, v in (("batch_fail_rate", brate), ("batch_expire_done", bdone)):
            if v is not None and v > 1:
                return "%s must be a fraction between 0 and 1" % k
        bstatus = req.get("batch_refuse_status")
        if bstatus is not None and (isinstance(bstatus, bool) or bstatus not in (429, 500, 503)):
            return "batch_refuse_status must be 429, 500 or 503"
        bexpire = req.get("batch_expire")
        if bexpire is not None and not isinstance(bexpire, bool):
            return "batch_expire must be true or false"
        bshuffle = req.get("batch_shuffle")
        if bshuffle is not None and not isinstance(bshuffle, bool):
            return "batch_shuffle must be true or false"
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
            # Batches take these when they are created; those under way keep their own.
            for k, v in (("batch_delay_s", bdelay), ("batch_fail_rate", brate),
                         ("batch_expire", bexpire), ("batch_expire_done", bdone),
                         ("batch_shuffle", bshuffle)):
                if v is not None:
                    self.batches.settings[k] = v
            if brefuse is not None:
                self.batches.refuse = brefuse
            if bstatus is not None:
                self.batches.refuse_status = bstatus
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
            self.batches.advance(now)
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
                    "batches": self.batches.snapshot(),
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


# ------------------------------------------------------------------ provider batches
# OpenAI's Files + Batch API and Anthropic's Message Batches. A batch is decided whole when
# it is created (every item's answer, failure or invalidity, and when each item is done), and
# read off the clock afterwards: whoever looks (a GET, /stats, the watchdog) first moves it
# on to where its times say it is. Nothing here passes the limits, outages or faults of the
# synchronous endpoints: providers limit batches separately.

OPENAI = "openai"
ANTHROPIC = "anthropic"
FILES = "/v1/files"
BATCHES = "/v1/batches"
MSG_BATCHES = "/v1/messages/batches"
MAX_UPLOAD = 64 * 1024 * 1024
DAY = 24 * 3600
# Anthropic's custom_id rule; OpenAI takes any non-empty string.
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
OPENAI_BATCH_KEYS = {"input_file_id", "endpoint", "completion_window", "metadata"}

# The routes with an id in them, by the template their requests are counted under.
ROUTES = [
    (re.compile(r"^/v1/files/([^/]+)/content$"), "/v1/files/{id}/content"),
    (re.compile(r"^/v1/files/([^/]+)$"), "/v1/files/{id}"),
    (re.compile(r"^/v1/batches/([^/]+)/cancel$"), "/v1/batches/{id}/cancel"),
    (re.compile(r"^/v1/batches/([^/]+)$"), "/v1/batches/{id}"),
    (re.compile(r"^/v1/messages/batches/([^/]+)/results$"), "/v1/messages/batches/{id}/results"),
    (re.compile(r"^/v1/messages/batches/([^/]+)/cancel$"), "/v1/messages/batches/{id}/cancel"),
    (re.compile(r"^/v1/messages/batches/([^/]+)$"), "/v1/messages/batches/{id}"),
]


def route(path):
    """(the path requests are counted under, the id in it or None)."""
    for rx, template in ROUTES:
        m = rx.match(path)
        if m:
            return template, urllib.parse.unquote(m.group(1))
    return path, None


def iso_micro(epoch):
    """RFC 3339 with microseconds, as Anthropic writes its batch times."""
    whole = int(epoch)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + \
        ".%06dZ" % int(round((epoch - whole) * 1e6) % 1000000)


def parse_multipart(ctype, raw):
    """{field name: (filename or None, bytes)} of a multipart/form-data body; ValueError
    when it is not a well-formed one."""
    m = email.message.Message()
    m["content-type"] = ctype or ""
    if m.get_content_type() != "multipart/form-data":
        raise ValueError("want Content-Type multipart/form-data")
    boundary = m.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise ValueError("the multipart Content-Type has no boundary")
    segs = (b"\r\n" + raw).split(b"\r\n--" + boundary.encode("latin-1"))
    if len(segs) < 3 or segs[0].strip():
        raise ValueError("the body is not multipart with that boundary")
    if not segs[-1].startswith(b"--"):
        raise ValueError("the multipart body has no closing boundary")
    fields = {}
    for seg in segs[1:-1]:
        if not seg.startswith(b"\r\n"):
            raise ValueError("a multipart boundary is not followed by a line break")
        head, sep, content = seg[2:].partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("a multipart part has no blank line after its headers")
        part = email.message.Message()
        for line in head.decode("latin-1").split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise ValueError("a multipart part has a bad header line")
            part[name.strip()] = value.strip()
        if part.get_content_disposition() != "form-data":
            raise ValueError("a multipart part is not form-data")
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise ValueError("a multipart part has no name")
        if name in fields:
            raise ValueError("the field %r is given twice" % name)
        fields[name] = (part.get_filename(), content)
    return fields


def openai_lines(data):
    """The requests of a batch input file: [(line number, custom_id, body)], or ValueError
    naming the first bad line. Blank lines are skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8")
    out, seen = [], set()
    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ValueError("line %d is not JSON" % no)
        if not isinstance(obj, dict):
            raise ValueError("line %d is not a JSON object" % no)
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid:
            raise ValueError("line %d: custom_id must be a non-empty string" % no)
        if cid in seen:
            raise ValueError("line %d: custom_id %s is used twice in the file" % (no, json.dumps(cid)))
        seen.add(cid)
        if obj.get("method") != "POST":
            raise ValueError("line %d: method must be POST" % no)
        if obj.get("url") != CHAT:
            raise ValueError("line %d: url must be %s" % (no, CHAT))
        if not isinstance(obj.get("body"), dict):
            raise ValueError("line %d: body must be a JSON object" % no)
        out.append((no, cid, obj["body"]))
    if not out:
        raise ValueError("the file holds no requests")
    return out


class Batches:
    """Every file and batch of both providers. Not locked: the Mock's lock covers it."""

    def __init__(self, args):
        self.seed = args.seed
        self.settings = {"batch_delay_s": args.batch_delay_s,
                         "batch_fail_rate": args.batch_fail_rate,
                         "batch_expire": args.batch_expire,
                         "batch_expire_done": args.batch_expire_done,
                         "batch_shuffle": args.batch_shuffle}
        self.files = {}          # id -> {"meta": file object, "data": bytes}
        self.batches = {}        # id -> batch (both providers; the id prefixes differ)
        self.live = []           # batches not ended yet, oldest first
        self.made = 0            # ids handed out
        self.submitted = {}      # (provider, custom_id) -> times in a batch before
        self.port = 0
        self.refuse = args.batch_refuse          # the next N batch requests get refuse_status
        self.refuse_status = args.batch_refuse_status
        self.refused = 0
        zero = {k: 0 for k in ("created", "completed", "expired", "cancelled", "failed",
                               "items", "items_succeeded", "items_failed", "items_expired",
                               "items_cancelled")}
        self.counts = {OPENAI: dict(zero), ANTHROPIC: dict(zero)}
        self.usage = {OPENAI: {"prompt": 0, "completion": 0}, ANTHROPIC: {"prompt": 0, "completion": 0}}

    def new_id(self, prefix):
        self.made += 1
        return prefix + digest(self.seed, "batch-id", self.made).hex()[:24]

    # -------------------------------------------------------------- files
    def add_file(self, data, purpose, filename):
        fid = self.new_id("file-")
        meta = {"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed",
                "status_details": None}
        self.files[fid] = {"meta": meta, "data": data}
        return meta

    # -------------------------------------------------------------- items
    def decide(self, provider, cid, parsed, err, req, settings):
        """One item's fate, decided at creation: ("ok", answer body, prompt tokens, completion
        tokens), ("fail", message) or ("invalid", message)."""
        k = self.submitted.get((provider, cid), 0)
        self.submitted[(provider, cid)] = k + 1
        if err:
            return ("invalid", err)
        prompt, last = parsed
        low = prompt.lower()
        u = random.Random(digest(self.seed, "batch-item", cid, k)).random()
        if "[mock:500]" in low or u < settings["batch_fail_rate"]:
            return ("fail", "internal error (mock batch item)")
        content = chat_content(prompt, last)
        if "[mock:malformed]" in low:
            content = "Sure! Here is the grade you asked for: %d" % (1 + digest(prompt)[0] % 5)
        reply = (chat_reply if provider == OPENAI else messages_reply)(req, prompt, content)
        return ("ok", reply, tokens(prompt), tokens(content))

    def create(self, provider, bid, items, extra):
        """items: [(custom_id, fate)]. Returns the batch."""
        now, wall = time.monotonic(), time.time()
        st = dict(self.settings)
        d = float(st["batch_delay_s"])
        n = len(items)
        keep = math.floor(st["batch_expire_done"] * n) if st["batch_expire"] else n
        # Items are done one after another across the middle 80 % of the delay; under expiry
        # only the first `keep` of them ever are.
        done = [now + 0.1 * d + 0.8 * d * (i + 1) / n if i < keep else math.inf
                for i in range(n)]
        b = {"provider": provider, "id": bid, "t0": now, "wall0": wall, "delay": d,
             "settings": st, "items": items, "done_at": done, "cancel_at": None,
             "end": None, "end_at": None, "results": None, "out_counts": None}
        b.update(extra)
        self.batches[bid] = b
        self.live.append(b)
        c = self.counts[provider]
        c["created"] += 1
        c["items"] += n
        return b

    def wall(self, b, mono):
        return b["wall0"] + (mono - b["t0"])

    def cancel_s(self, b):
        return min(1.0, b["delay"] / 10)

    def end_time(self, b):
        """(when, how) this batch ends as things stand."""
        if b["cancel_at"] is not None:
            return b["cancel_at"] + self.cancel_s(b), "cancelled"
        if b.get("invalid"):
            return b["t0"] + 0.1 * b["delay"], "failed"
        return b["t0"] + b["delay"], "expired" if b["settings"]["batch_expire"] else "completed"

    def advance(self, now):
        """Ends every batch whose end time has passed."""
        still = []
        for b in self.live:
            at, how = self.end_time(b)
            if at <= now:
                self.finish(b, at, how)
            else:
                still.append(b)
        self.live = still

    def finish(self, b, at, how):
        b["end"], b["end_at"] = how, at
        fates = []
        for (cid, fate), done in zip(b["items"], b["done_at"]):
            if how == "failed":
                fates.append((cid, ("not_run",)))
            elif how == "cancelled" and done > b["cancel_at"]:
                fates.append((cid, ("cancelled",)))
            elif done == math.inf:
                fates.append((cid, ("expired",)))
            else:
                fates.append((cid, fate))
        c, u = self.counts[b["provider"]], self.usage[b["provider"]]
        c[how] += 1
        tally = {"ok": 0, "fail": 0, "expired": 0, "cancelled": 0}
        for _, f in fates:
            if f[0] == "ok":
                tally["ok"] += 1
                u["prompt"] += f[2]
                u["completion"] += f[3]
            elif f[0] in ("fail", "invalid"):
                tally["fail"] += 1
            elif f[0] in tally:
                tally[f[0]] += 1
        c["items_succeeded"] += tally["ok"]
        c["items_failed"] += tally["fail"]
        c["items_expired"] += tally["expired"]
        c["items_cancelled"] += tally["cancelled"]
        b["out_counts"] = tally
        if b["settings"]["batch_shuffle"]:
            # Neither provider promises an order: a client must match on custom_id.
            fates.sort(key=lambda cf: digest(self.seed, "shuffle", b["id"], cf[0]))
        if b["provider"] == OPENAI:
            self.openai_files(b, fates)
        else:
            b["results"] = "".join(json.dumps(self.anthropic_result(cid, f), ensure_ascii=False) + "\n"
                                   for cid, f in fates).encode("utf-8")

    def openai_files(self, b, fates):
        out, err = [], []
        for cid, f in fates:
            if f[0] == "not_run":
                continue
            rid = digest(b["id"], cid).hex()
            line = {"id": "batch_req_" + rid[:24], "custom_id": cid}
            if f[0] == "ok":
                line["response"] = {"status_code": 200, "request_id": "req_" + rid[24:48], "body": f[1]}
                line["error"] = None
                out.append(line)
                continue
            if f[0] in ("fail", "invalid"):
                code, kind = (500, "server_error") if f[0] == "fail" else (400, "invalid_request_error")
                line["response"] = {"status_code": code, "request_id": "req_" + rid[24:48],
                                    "body": {"error": {"message": f[1], "type": kind,
                                                       "param": None, "code": None}}}
                line["error"] = None
            else:
                code = "batch_expired" if f[0] == "expired" else "batch_cancelled"
                line["response"] = None
                line["error"] = {"code": code, "message": (
                    "This request could not be executed before the completion window expired."
                    if f[0] == "expired" else "The batch was cancelled before this request ran.")}
            err.append(line)

        def keep(lines, what):
            if not lines:
                return None
            data = "".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines).encode("utf-8")
            return self.add_file(data, "batch_output", "%s_%s.jsonl" % (b["id"], what))["id"]
        b["output_file_id"] = keep(out, "output")
        b["error_file_id"] = keep(err, "error")

    @staticmethod
    def anthropic_result(cid, f):
        if f[0] == "ok":
            r = {"type": "succeeded", "message": f[1]}
        elif f[0] in ("fail", "invalid"):
            kind = "api_error" if f[0] == "fail" else "invalid_request_error"
            r = {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": f[1]}}}
        elif f[0] == "expired":
            r = {"type": "expired"}
        else:
            r = {"type": "canceled"}
        return {"custom_id": cid, "result": r}

    def progress(self, b, now):
        """(done ok, done failed) so far, for a batch not ended."""
        until = now if b["cancel_at"] is None else min(now, b["cancel_at"])
        ok = bad = 0
        for (_, fate), done in zip(b["items"], b["done_at"]):
            if done <= until:
                if fate[0] == "ok":
                    ok += 1
                else:
                    bad += 1
        return ok, bad

    # -------------------------------------------------------------- the objects
    def openai_object(self, b, now):
        d, t0 = b["delay"], b["t0"]
        n = len(b["items"])

        def at(mono):
            return int(self.wall(b, mono)) if mono is not None and mono <= now else None
        end = b["end"]
        if end:
            status = end
            if end == "failed":
                counts = {"total": n, "completed": 0, "failed": 0}
            else:
                t = b["out_counts"]
                counts = {"total": n, "completed": t["ok"], "failed": n - t["ok"]}
        else:
            ok, bad = self.progress(b, now)
            counts = {"total": n, "completed": ok, "failed": bad}
            el = now - t0
            if b["cancel_at"] is not None:
                status = "cancelling"
            elif el < 0.1 * d:
                status = "validating"
            elif el < 0.9 * d:
                status = "in_progress"
            else:
                status = "finalizing"
        ran = end not in ("failed",) and (b["cancel_at"] is None or b["cancel_at"] >= t0 + 0.1 * d)
        prog_at = at(t0 + 0.1 * d) if ran else None
        fin_at = at(t0 + 0.9 * d) if ran and end in (None, "completed", "expired") and \
            b["cancel_at"] is None else None
        return {
            "id": b["id"], "object": "batch", "endpoint": b["endpoint"],
            "errors": b.get("errors") if end == "failed" else None,
            "input_file_id": b["input_file_id"],
            "completion_window": b["completion_window"], "status": status,
            "output_file_id": b.get("output_file_id"), "error_file_id": b.get("error_file_id"),
            "created_at": int(b["wall0"]), "in_progress_at": prog_at,
            "expires_at": int(b["wall0"]) + DAY, "finalizing_at": fin_at,
            "completed_at": at(b["end_at"]) if end == "completed" else None,
            "failed_at": at(b["end_at"]) if end == "failed" else None,
            "expired_at": at(b["end_at"]) if end == "expired" else None,
            "cancelling_at": at(b["cancel_at"]) if b["cancel_at"] is not None else None,
            "cancelled_at": at(b["end_at"]) if end == "cancelled" else None,
            "request_counts": counts, "metadata": b.get("metadata"),
        }

    def anthropic_object(self, b, now):
        n = len(b["items"])
        end = b["end"]
        if end:
            t = b["out_counts"]
            counts = {"processing": 0, "succeeded": t["ok"], "errored": t["fail"],
                      "canceled": t["cancelled"], "expired": t["expired"]}
            status = "ended"
        else:
            ok, bad = self.progress(b, now)
            counts = {"processing": n - ok - bad, "succeeded": ok, "errored": bad,
                      "canceled": 0, "expired": 0}
            status = "canceling" if b["cancel_at"] is not None else "in_progress"
        return {
            "id": b["id"], "type": "message_batch", "processing_status": status,
            "request_counts": counts,
            "ended_at": iso_micro(self.wall(b, b["end_at"])) if end else None,
            "created_at": iso_micro(b["wall0"]), "expires_at": iso_micro(b["wall0"] + DAY),
            "archived_at": None,
            "cancel_initiated_at": iso_micro(self.wall(b, b["cancel_at"]))
            if b["cancel_at"] is not None else None,
            "results_url": "http://127.0.0.1:%d%s/%s/results" % (self.port, MSG_BATCHES, b["id"])
            if end else None,
        }

    def snapshot(self):
        def total(k):
            return sum(c[k] for c in self.counts.values())
        out = {k: total(k) for k in self.counts[OPENAI]}
        out["live"] = len(self.live)
        out["files"] = len(self.files)
        tok = {p: dict(u, total=u["prompt"] + u["completion"]) for p, u in self.usage.items()}
        out["tokens"] = {k: sum(t[k] for t in tok.values()) for k in ("prompt", "completion", "total")}
        out["by_provider"] = {p: dict(self.counts[p], tokens=tok[p]) for p in (OPENAI, ANTHROPIC)}
        out["refused"] = self.refused
        out["settings"] = dict(self.settings, batch_refuse=self.refuse,
                               batch_refuse_status=self.refuse_status)
        return out


def prompt_key(prompt):
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()


# The request parsing and the answer bodies of the two completion shapes, shared by the
# synchronous endpoints and the batch items (so a batch answers exactly what a call would).
def chat_parse(req):
    """((prompt, last message), None) for an OpenAI chat request, or (None, error text)."""
    msgs = req.get("messages") if isinstance(req, dict) else None
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
        return None, "messages must be a non-empty list of {role, content}"
    return ("\n".join(m["content"] for m in msgs), msgs[-1]["content"]), None


def chat_reply(req, prompt, content):
    pt, ct = tokens(prompt), tokens(content)
    return {
        "id": "mock-" + prompt_key(prompt)[:16],
        "object": "chat.completion",
        "model": req.get("model") or "mock",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
    }


def messages_parse(req):
    """((prompt, last message), None) for an Anthropic messages request, or (None, error)."""
    msgs = req.get("messages") if isinstance(req, dict) else None
    texts = [anthropic_text(m.get("content")) if isinstance(m, dict) else None
             for m in msgs] if isinstance(msgs, list) else []
    if not texts or any(t is None for t in texts):
        return None, ("messages must be a non-empty list of {role, content}, "
                      "content a string or text blocks")
    system = req.get("system")
    if system is not None:
        system = anthropic_text(system)
        if system is None:
            return None, "system must be a string or text blocks"
    return ("\n".join(([system] if system is not None else []) + texts), texts[-1]), None


def messages_reply(req, prompt, content):
    return {
        "id": "msg_mock" + prompt_key(prompt)[:16],
        "type": "message",
        "role": "assistant",
        "model": req.get("model") or "mock",
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tokens(prompt), "output_tokens": tokens(content)},
    }


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
        path, oid = route(self.path_only())
        if path == "/_stats":
            return self.send_json(200, self.mock.snapshot())
        self.mock.arrive(path)
        if path in BATCH_GETS:
            if self.batch_refused(path):
                return
            return BATCH_GETS[path](self, path, oid)
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

    def read_body(self, limit):
        """The request body, by Content-Length or chunked (libcurl chunks a multipart upload
        whose size it does not know). ValueError when it is malformed or over `limit`; the
        connection is then closed, since the rest of the body may be unread."""
        try:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                parts, total = [], 0
                while True:
                    line = self.rfile.readline(1024)
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise ValueError("a bad chunk size line")
                    if size < 0:
                        raise ValueError("a bad chunk size line")
                    if size == 0:
                        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                            pass    # trailers
                        return b"".join(parts)
                    total += size
                    if total > limit:
                        raise ValueError("body too large")
                    parts.append(self.rfile.read(size))
                    if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                        raise ValueError("a chunk is longer than its size")
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise ValueError("a bad Content-Length")
            if n < 0 or n > limit:
                raise ValueError("body too large")
            return self.rfile.read(n) if n else b""
        except ValueError:
            self.close_connection = True
            raise

    def read_json(self):
        return json.loads(self.read_body(MAX_BODY).decode("utf-8"))

    def error_body(self, path, kind, msg):
        if path.startswith(MESSAGES):
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
        path, oid = route(path)
        self.mock.arrive(path)
        if path in BATCH_POSTS and self.batch_refused(path):
            return
        if path == FILES:
            return self.upload(path)
        if path in BATCH_CANCELS:
            if not self.drain():
                return self.bad(path, "request body is malformed or too large")
            return self.cancel(path, oid)
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
        if path == BATCHES:
            return self.openai_create(path, req)
        if path == MSG_BATCHES:
            return self.anthropic_create(path, req)
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
        parsed, err = chat_parse(req)
        if err:
            return self.bad(path, err)
        prompt, last = parsed
        key = prompt_key(prompt)
        got = self.answer_text(path, key, prompt, last, tokens(prompt))
        if got is None:
            return
        content, headers = got
        self.send_json(200, chat_reply(req, prompt, content), headers)

    def messages(self, path, req):
        parsed, err = messages_parse(req)
        if err:
            return self.bad(path, err)
        prompt, last = parsed
        key = prompt_key(prompt)
        got = self.answer_text(path, key, prompt, last, tokens(prompt))
        if got is None:
            return
        content, headers = got
        self.send_json(200, messages_reply(req, prompt, content), headers)

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

    # ---------------------------------------------------------- provider batches
    def send_bytes(self, status, data, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, path, status, msg):
        """An error of the endpoint's shape: 404 not found, 409 not in a state for it."""
        self.mock.answered(path, str(status))
        if path.startswith(MESSAGES):
            kind = "not_found_error" if status == 404 else "invalid_request_error"
            return self.send_json(status, {"type": "error", "error": {"type": kind, "message": msg}})
        self.send_json(status, {"error": {"message": msg, "type": "invalid_request_error",
                                          "param": None, "code": None}})

    def ok(self, path, obj):
        self.mock.answered(path, "200")
        self.send_json(200, obj)

    def drain(self):
        """Reads a body nobody needs (a cancel's); False when it is malformed or too large."""
        try:
            self.read_body(MAX_BODY)
        except ValueError:
            return False
        return True

    def batch_refused(self, path):
        """Refuses this batch request when /_control asked for the next N to be refused
        (a provider's 500, its 429 with Retry-After: 1, or its 503); True when it did."""
        with self.mock.lock:
            bs = self.mock.batches
            if bs.refuse <= 0:
                return False
            bs.refuse -= 1
            bs.refused += 1
            status = bs.refuse_status
        if self.command == "POST":
            try:
                self.read_body(MAX_UPLOAD)
            except ValueError:
                pass
        anthropic = path.startswith(MESSAGES)
        kind = {429: "rate_limit_error" if anthropic else "rate_limit",
                500: "api_error" if anthropic else "server_error",
                503: "overloaded_error" if anthropic else "server_error"}[status]
        self.mock.answered(path, str(status))
        self.send_json(status, self.error_body(path, kind, "batch request refused (mock)"),
                       {"retry-after": "1"} if status != 500 else None)
        return True

    def upload(self, path):
        try:
            raw = self.read_body(MAX_UPLOAD)
        except ValueError as e:
            return self.bad(path, "bad multipart body: %s (want at most %d bytes)" % (e, MAX_UPLOAD))
        if not raw:
            return self.bad(path, "want a multipart/form-data body, not an empty one")
        try:
            fields = parse_multipart(self.headers.get("Content-Type"), raw)
        except ValueError as e:
            return self.bad(path, "bad multipart body: %s" % e)
        if "purpose" not in fields or fields["purpose"][1] != b"batch":
            return self.bad(path, "purpose must be batch")
        if "file" not in fields:
            return self.bad(path, "the file field is missing")
        name, data = fields["file"]
        try:
            openai_lines(data)
        except ValueError as e:
            return self.bad(path, "invalid batch file: %s" % e)
        with self.mock.lock:
            meta = self.mock.batches.add_file(data, "batch", name or "upload.jsonl")
        self.ok(path, meta)

    def openai_create(self, path, req):
        if not isinstance(req, dict):
            return self.bad(path, "want a JSON object")
        unknown = sorted(set(req) - OPENAI_BATCH_KEYS)
        if unknown:
            return self.bad(path, "unknown parameters: " + ", ".join(unknown))
        if req.get("endpoint") != CHAT:
            return self.bad(path, "endpoint must be " + CHAT)
        if req.get("completion_window") != "24h":
            return self.bad(path, "completion_window must be 24h")
        meta = req.get("metadata")
        if meta is not None and (not isinstance(meta, dict) or len(meta) > 16 or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in meta.items())):
            return self.bad(path, "metadata must be at most 16 string pairs "
                            "(keys up to 64 characters, values up to 512)")
        fid = req.get("input_file_id")
        bs = self.mock.batches
        with self.mock.lock:
            f = bs.files.get(fid) if isinstance(fid, str) else None
            if f is None or f["meta"]["purpose"] != "batch":
                refused = True
            else:
                refused = False
                lines = openai_lines(f["data"])
                models = {json.dumps(body.get("model")) for _, _, body in lines}
                bid = bs.new_id("batch_")
                extra = {"endpoint": CHAT, "input_file_id": fid, "completion_window": "24h",
                         "metadata": meta, "output_file_id": None, "error_file_id": None}
                if len(models) > 1:
                    # As the real one: one model a file, found while validating.
                    first = next(no for no, _, body in lines
                                 if json.dumps(body.get("model")) != json.dumps(lines[0][2].get("model")))
                    extra["invalid"] = True
                    extra["errors"] = {"object": "list", "data": [{
                        "code": "mismatched_model", "param": "body.model", "line": first,
                        "message": "every request of a batch file must use the same model"}]}
                    items = [(cid, ("not_run",)) for _, cid, _ in lines]
                else:
                    items = [(cid, bs.decide(OPENAI, cid, *chat_parse(body), body, bs.settings))
                             for _, cid, body in lines]
                b = bs.create(OPENAI, bid, items, extra)
                obj = bs.openai_object(b, time.monotonic())
        if refused:
            return self.bad(path, "no batch input file with id %s" % json.dumps(fid))
        self.ok(path, obj)

    def anthropic_create(self, path, req):
        if not isinstance(req, dict) or set(req) != {"requests"}:
            return self.bad(path, "want {\"requests\": [...]} and nothing else")
        reqs = req["requests"]
        if not isinstance(reqs, list) or not reqs:
            return self.bad(path, "requests must be a non-empty list")
        seen = set()
        for i, r in enumerate(reqs):
            if not isinstance(r, dict) or set(r) != {"custom_id", "params"}:
                return self.bad(path, "requests.%d: want {custom_id, params}" % i)
            cid = r["custom_id"]
            if not isinstance(cid, str) or not ANTHROPIC_ID.match(cid):
                return self.bad(path, "requests.%d.custom_id: 1 to 64 of a-z A-Z 0-9 _ -" % i)
            if cid in seen:
                return self.bad(path, "requests.%d.custom_id: %s is used twice" % (i, cid))
            seen.add(cid)
            if not isinstance(r["params"], dict):
                return self.bad(path, "requests.%d.params must be an object" % i)
        bs = self.mock.batches
        with self.mock.lock:
            items = [(r["custom_id"], bs.decide(ANTHROPIC, r["custom_id"], *messages_parse(r["params"]),
                                                r["params"], bs.settings)) for r in reqs]
            b = bs.create(ANTHROPIC, bs.new_id("msgbatch_"), items, {})
            obj = bs.anthropic_object(b, time.monotonic())
        self.ok(path, obj)

    def find(self, oid, provider):
        """The batch (caller holds the lock, batches advanced), or None."""
        b = self.mock.batches.batches.get(oid)
        return b if b is not None and b["provider"] == provider else None

    def openai_get(self, path, oid):
        with self.mock.lock:
            now = time.monotonic()
            self.mock.batches.advance(now)
            b = self.find(oid, OPENAI)
            obj = self.mock.batches.openai_object(b, now) if b else None
        if obj is None:
            return self.refuse(path, 404, "no batch with id %s" % json.dumps(oid))
        self.ok(path, obj)

    def anthropic_get(self, path, oid):
        with self.mock.lock:
            now = time.monotonic()
            self.mock.batches.advance(now)
            b = self.find(oid, ANTHROPIC)
            obj = self.mock.batches.anthropic_object(b, now) if b else None
        if obj is None:
            return self.refuse(path, 404, "no message batch with id %s" % json.dumps(oid))
        self.ok(path, obj)

    def listing(self, path, oid):
        provider = ANTHROPIC if path.startswith(MESSAGES) else OPENAI
        bs = self.mock.batches
        with self.mock.lock:
            now = time.monotonic()
            bs.advance(now)
            show = bs.openai_object if provider == OPENAI else bs.anthropic_object
            data = [show(b, now) for b in reversed(list(bs.batches.values()))
                    if b["provider"] == provider]
        obj = {"data": data, "has_more": False,
               "first_id": data[0]["id"] if data else None,
               "last_id": data[-1]["id"] if data else None}
        if provider == OPENAI:
            obj["object"] = "list"
        self.ok(path, obj)

    def file_meta(self, path, oid):
        with self.mock.lock:
            f = self.mock.batches.files.get(oid)
            meta = dict(f["meta"]) if f else None
        if meta is None:
            return self.refuse(path, 404, "no file with id %s" % json.dumps(oid))
        self.ok(path, meta)

    def file_content(self, path, oid):
        with self.mock.lock:
            f = self.mock.batches.files.get(oid)
        if f is None:
            return self.refuse(path, 404, "no file with id %s" % json.dumps(oid))
        self.mock.answered(path, "200")
        self.send_bytes(200, f["data"], "application/octet-stream")

    def results(self, path, oid):
        with self.mock.lock:
            self.mock.batches.advance(time.monotonic())
            b = self.find(oid, ANTHROPIC)
            data = b["results"] if b else None
        if b is None:
            return self.refuse(path, 404, "no message batch with id %s" % json.dumps(oid))
        if data is None:
            return self.refuse(path, 409, "message batch %s has not ended: no results yet" % oid)
        self.mock.answered(path, "200")
        self.send_bytes(200, data, "application/x-jsonl")

    def cancel(self, path, oid):
        provider = ANTHROPIC if path.startswith(MESSAGES) else OPENAI
        bs = self.mock.batches
        with self.mock.lock:
            now = time.monotonic()
            bs.advance(now)
            b = self.find(oid, provider)
            ended = b is not None and b["end"] is not None
            if b is not None and not ended and b["cancel_at"] is None:
                b["cancel_at"] = now
            if b is not None:
                obj = (bs.openai_object if provider == OPENAI else bs.anthropic_object)(b, now)
        if b is None:
            return self.refuse(path, 404, "no batch with id %s" % json.dumps(oid))
        if ended:
            return self.refuse(path, 409, "batch %s has ended (%s): nothing to cancel" % (oid, b["end"]))
        self.ok(path, obj)


BATCH_GETS = {
    FILES + "/{id}": Handler.file_meta,
    FILES + "/{id}/content": Handler.file_content,
    BATCHES: Handler.listing,
    BATCHES + "/{id}": Handler.openai_get,
    MSG_BATCHES: Handler.listing,
    MSG_BATCHES + "/{id}": Handler.anthropic_get,
    MSG_BATCHES + "/{id}/results": Handler.results,
}
BATCH_CANCELS = {BATCHES + "/{id}/cancel", MSG_BATCHES + "/{id}/cancel"}
BATCH_POSTS = BATCH_CANCELS | {FILES, BATCHES, MSG_BATCHES}

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
    ap.add_argument("--batch-delay-s", type=delay_seconds, default=2.0, metavar="S",
                    help="seconds from a batch's creation to its end (default 2)")
    ap.add_argument("--batch-fail-rate", type=fraction, default=0.0, metavar="F",
                    help="share of batch items that fail (by a hash of seed and custom_id)")
    ap.add_argument("--batch-expire", action="store_true",
                    help="batches expire at the delay instead of completing")
    ap.add_argument("--batch-expire-done", type=fraction, default=0.5, metavar="F",
                    help="under --batch-expire, the share of items done first (default 0.5)")
    ap.add_argument("--batch-shuffle", action="store_true",
                    help="batch output, error and results lines in no particular order")
    ap.add_argument("--batch-refuse", type=count, default=0, metavar="N",
                    help="refuse the first N batch requests (test a client's retries)")
    ap.add_argument("--batch-refuse-status", type=int, choices=(429, 500, 503), default=500)
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
    mock.batches.port = srv.server_address[1]
    print("PORT %d" % srv.server_address[1], flush=True)

    def watchdog():
        while not mock.stop.wait(0.2):
            with mock.lock:
                mock.batches.advance(time.monotonic())
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
