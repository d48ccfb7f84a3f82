#!/usr/bin/env python3
"""Drives a headless Chromium over the DevTools protocol for tests/integration/dashboard.sh.

The browser is started by the test (--remote-debugging-port=0 --user-data-dir=DIR); each
call of this script attaches to its page, does one step and prints one JSON object:

  dashboard_browser.py DIR load URL            the page's facts (see FACTS)
  dashboard_browser.py DIR submit URL ACTION TOKEN [FIELD=VALUE...]
        loads URL, fills the token into the form posting to /api/ACTION (whose hidden
        fields match FIELD=VALUE) and clicks its button; the result page's facts
  dashboard_browser.py DIR click URL SELECTOR  clicks the first SELECTOR; the next page's facts
  dashboard_browser.py DIR screenshot URL PNG  saves a screenshot; the bar's box and the
        share of the bar's pixels in each colour (decoded here: zlib, no imaging library)

Debian packages only: python3 and python3-websocket.
"""
import base64
import json
import os
import struct
import sys
import time
import urllib.request
import zlib

import websocket

DEADLINE_S = 60  # the CI machine is loaded: generous, and only a bound

# What a page shows, read after it loaded (textContent: what a person reads, not the HTML).
FACTS = r"""(() => {
  const t = (s) => { const e = document.querySelector(s); return e ? e.textContent : null; };
  const n = (s) => { const v = t(s); return v === null ? null : Number(v); };
  return {
    url: location.pathname + location.search,
    title: document.title,
    scripts: document.scripts.length,
    images: document.images.length,
    total: n('#n-total'), done: n('#n-done'), dead: n('#n-dead'),
    leased: n('#n-leased'), pending: n('#n-pending'),
    batch: t('#batch-name'),
    chart_rects: document.querySelectorAll('#chart rect[class^="m-"]').length,
    bar_segments: [...document.querySelectorAll('#bar rect[class^="seg-"]')].map(
      r => r.getAttribute('class')),
    reasons: [...document.querySelectorAll('#dead-reasons td.reason')].map(e => e.textContent),
    example_ids: [...document.querySelectorAll('#dead-reasons a.task')].map(e => e.textContent),
    workers: [...document.querySelectorAll('#workers td:first-child')].map(e => e.textContent),
    holds: [...document.querySelectorAll('#holds td.scope')].map(e => e.textContent),
    task_status: t('#task-status'), last_error: t('#last-error'),
    attempts: [...document.querySelectorAll('#attempts tr.attempt')].map(
      r => r.querySelector('td.n').textContent + ' ' + r.querySelector('td.kind').textContent),
    previous_batch: t('#previous-batch'), wall_previous: t('#wall-previous'),
    previous_dead: n('#prev-dead'),
    canaries: [...document.querySelectorAll('#canaries tr.canary')].map(r => [
      r.querySelector('td.state').textContent, r.querySelector('td.verdict').textContent,
      r.querySelector('td.reason').textContent]),
    message: t('#message'),
    text: document.body ? document.body.innerText.slice(0, 4000) : ''
  };
})()"""


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.exit(1)


class Page:
    def __init__(self, user_dir):
        deadline = time.monotonic() + DEADLINE_S
        port_file = os.path.join(user_dir, "DevToolsActivePort")
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.monotonic() > deadline:
                fail("the browser wrote no DevToolsActivePort")
            time.sleep(0.05)
        port = open(port_file).read().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            targets = [t for t in json.load(r) if t.get("type") == "page"]
        if not targets:
            fail("the browser has no page")
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0
        self.events = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            m = json.loads(self.ws.recv())
            if m.get("id") == my:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)
        fail(f"{method}: no answer in {DEADLINE_S}s")

    def wait_event(self, name):
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == name:
                    del self.events[: i + 1]
                    return m
            if time.monotonic() > deadline:
                fail(f"no {name} in {DEADLINE_S}s")
            self.events.append(json.loads(self.ws.recv()))

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            fail(f"script failed: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def load(self, url):
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def after_click(self, expr):
        """Runs expr (which clicks) and waits for the page it leads to."""
        self.events.clear()
        if not self.eval(expr):
            fail("nothing to click")
        self.wait_event("Page.loadEventFired")


def png_pixels(data):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                fail(f"PNG of depth {depth}, colour type {ctype}")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return w, h, rows


COLOURS = {"done": (0x2e, 0x7d, 0x32), "dead": (0xc6, 0x28, 0x28),
           "leased": (0x15, 0x65, 0xc0), "pending": (0xb0, 0xbe, 0xc5)}


def near(p, q):
    return all(abs(a - b) <= 12 for a, b in zip(p, q))


def main():
    if len(sys.argv) < 4:
        fail("usage: dashboard_browser.py DIR load|submit|click|screenshot URL ...")
    page = Page(sys.argv[1])
    step, url = sys.argv[2], sys.argv[3]
    page.load(url)
    if step == "submit":
        action, token = sys.argv[4], sys.argv[5]
        fields = dict(a.split("=", 1) for a in sys.argv[6:])
        page.after_click("""((action, token, fields) => {
          for (const f of document.querySelectorAll('form.action')) {
            if (f.getAttribute('action') !== '/api/' + action) continue;
            if (!Object.entries(fields).every(([k, v]) => f.elements[k] && f.elements[k].value === v))
              continue;
            f.elements['token'].value = token;
            f.querySelector('button').click();
            return true;
          }
          return false;
        })(%s, %s, %s)""" % (json.dumps(action), json.dumps(token), json.dumps(fields)))
    elif step == "click":
        page.after_click("(() => { const e = document.querySelector(%s); if (!e) return false;"
                         " e.click(); return true; })()" % json.dumps(sys.argv[4]))
    facts = page.eval(FACTS)
    if step == "screenshot":
        box = page.eval("(() => { const r = document.querySelector('#bar')"
                        ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()")
        shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
        with open(sys.argv[4], "wb") as f:
            f.write(shot)
        w, h, rows = png_pixels(shot)
        dpr = w / page.eval("window.innerWidth")
        x0, y0 = int((box[0] + 1) * dpr), int((box[1] + box[3] / 2) * dpr)
        x1 = int((box[0] + box[2] - 1) * dpr)
        line = rows[y0][x0:x1]
        facts["bar_share"] = {k: sum(near(p, c) for p in line) / max(1, len(line))
                              for k, c in COLOURS.items()}
        chart = page.eval("(() => { const r = document.querySelector('#chart')"
                          ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()")
        cx0, cy0 = int(chart[0] * dpr), int(chart[1] * dpr)
        cx1, cy1 = int((chart[0] + chart[2]) * dpr), int((chart[1] + chart[3]) * dpr)
        facts["chart_pixels"] = {k: sum(near(p, c) for r in rows[cy0:cy1] for p in r[cx0:cx1])
                                 for k, c in COLOURS.items() if k in ("done", "dead")}
        facts["png"] = [w, h]
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
