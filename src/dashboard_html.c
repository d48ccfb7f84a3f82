/* dashboard_html: pages and SVG charts drawn from the dashboard's JSON. */
#include "dashboard_html.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAR_W 600
#define CHART_SLOTS 60   /* minutes */
#define CHART_SLOT_W 10
#define CHART_H 120
#define PAYLOAD_SHOWN 20000   /* bytes of a value shown on a task's page */

void html_escape(struct buf *b, const char *s)
{
  if (!s)
    return;
  const char *run = s;
  for (; *s; s++) {
    const char *e = NULL;
    switch (*s) {
    case '&': e = "&amp;"; break;
    case '<': e = "&lt;"; break;
    case '>': e = "&gt;"; break;
    case '"': e = "&quot;"; break;
    case '\'': e = "&#39;"; break;
    }
    if (e) {
      buf_add(b, run, (size_t)(s - run));
      buf_puts(b, e);
      run = s + 1;
    }
  }
  buf_add(b, run, (size_t)(s - run));
}

/* A query parameter's value: letters, digits and -._~ kept, the rest %XX. */
static void url_escape(struct buf *b, const char *s)
{
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
        ch == '-' || ch == '.' || ch == '_' || ch == '~')
      buf_add(b, (const char *)&ch, 1);
    else
      buf_printf(b, "%%%02X", ch);
  }
}

static long long num(json_t *o, const char *k)
{
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? json_integer_value(v) : (long long)json_number_value(v);
}

/* A value of the JSON as text: strings as they are, null as "", the rest as JSON. */
static void put_value(struct buf *b, json_t *v, size_t max)
{
  if (!v || json_is_null(v))
    return;
  char *s = json_is_string(v) ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  const char *text = s ? s : json_string_value(v);
  if (!text)
    return;
  size_t n = strlen(text);
  if (n > max) {
    char *cut = strndup(text, max);
    html_escape(b, cut);
    free(cut);
    buf_printf(b, " … (%zu bytes in all)", n);
  } else {
    html_escape(b, text);
  }
  free(s);
}

static void head(struct buf *b, const char *title, const char *table, int refresh)
{
  buf_puts(b, "<!doctype html>\n<html lang=en><head><meta charset=utf-8>");
  if (refresh > 0)
    buf_printf(b, "<meta http-equiv=refresh content=%d>", refresh);
  buf_puts(b, "<meta name=viewport content=\"width=device-width\">"
              "<link rel=stylesheet href=\"/dashboard.css\"><title>");
  html_escape(b, title);
  buf_puts(b, " · leash</title></head><body><header><a href=\"/\">leash dashboard</a> <span>");
  html_escape(b, table);
  buf_puts(b, "</span></header><main>\n");
}

static char *finish(struct buf *b)
{
  buf_puts(b, "</main></body></html>\n");
  return buf_take(b);
}

/* A form posting an action; fields: name=value pairs (values escaped), NULL-terminated. */
static void action_form(struct buf *b, const char *action, const char *label, const char *back,
                        const char *const *fields, int with_for)
{
  buf_printf(b, "<form class=action method=post action=\"/api/%s\">", action);
  buf_puts(b, "<input type=hidden name=html value=1><input type=hidden name=back value=\"");
  html_escape(b, back);
  buf_puts(b, "\">");
  for (int i = 0; fields[i]; i += 2) {
    buf_printf(b, "<input type=hidden name=%s value=\"", fields[i]);
    html_escape(b, fields[i + 1]);
    buf_puts(b, "\">");
  }
  if (with_for)
    buf_puts(b, "<input name=for placeholder=\"for (10m)\" size=7>");
  buf_printf(b, "<input type=password name=token placeholder=token size=10 required>"
                "<button type=submit data-action=%s>", action);
  html_escape(b, label);
  buf_puts(b, "</button></form>");
}

/* The progress bar: done, dead, leased, pending, left to right, widths by count. */
static void bar(struct buf *b, json_t *k, int w, int h, const char *id)
{
  static const struct { const char *key, *colour; } parts[] = {
    { "done", DASH_COLOUR_DONE }, { "dead", DASH_COLOUR_DEAD },
    { "leased", DASH_COLOUR_LEASED }, { "pending", DASH_COLOUR_PENDING },
  };
  long long total = 0;
  for (size_t i = 0; i < 4; i++)
    total += num(k, parts[i].key);
  buf_printf(b, "<svg class=bar%s%s%s width=%d height=%d viewBox=\"0 0 %d %d\" role=img>",
             id ? " id=\"" : "", id ? id : "", id ? "\"" : "", w, h, w, h);
  buf_printf(b, "<rect width=%d height=%d fill=\"#eceff1\"/>", w, h);
  double x = 0;
  for (size_t i = 0; total > 0 && i < 4; i++) {
    double pw = (double)num(k, parts[i].key) * w / (double)total;
    if (pw > 0)
      buf_printf(b, "<rect class=\"seg-%s\" x=\"%.2f\" width=\"%.2f\" height=%d fill=\"%s\">"
                    "<title>%s %lld</title></rect>",
                 parts[i].key, x, pw, h, parts[i].colour, parts[i].key, num(k, parts[i].key));
    x += pw;
  }
  buf_puts(b, "</svg>");
}

static void counts(struct buf *b, json_t *k, const char *prefix)
{
  static const char *const keys[] = { "done", "dead", "leased", "pending" };
  buf_puts(b, "<span class=counts>");
  for (size_t i = 0; i < 4; i++)
    buf_printf(b, "<span class=\"c-%s\">%s <b%s%s%s%s>%lld</b></span> ", keys[i], keys[i],
               prefix ? " id=\"" : "", prefix ? prefix : "", prefix ? keys[i] : "",
               prefix ? "\"" : "", num(k, keys[i]));
  buf_puts(b, "</span>");
}

/* The batches: one line each, a link to its view, its bar and counts. */
static void section_batches(struct buf *b, json_t *o)
{
  json_t *batches = json_object_get(o, "batches"), *x;
  size_t i;
  buf_puts(b, "<section id=batches><h2>Batches</h2>");
  if (json_array_size(batches) == 0)
    buf_puts(b, "<p class=empty>No batch: no task was enqueued with --batch.</p>");
  else
    buf_puts(b, "<table><tr><th>batch</th><th>progress</th><th>total</th><th>counts</th></tr>");
  json_array_foreach(batches, i, x) {
    const char *name = json_string_value(json_object_get(x, "batch"));
    buf_puts(b, "<tr><td><a href=\"/?batch=");
    url_escape(b, name);
    buf_puts(b, "\">");
    html_escape(b, name);
    buf_puts(b, "</a></td><td>");
    bar(b, x, 240, 14, NULL);
    buf_printf(b, "</td><td>%lld</td><td>", num(x, "total"));
    counts(b, x, NULL);
    buf_puts(b, "</td></tr>");
  }
  if (json_array_size(batches) > 0)
    buf_puts(b, "</table>");
  buf_puts(b, "</section>\n");
}

/* Settles per minute over the last hour: stacked done (bottom), retried, dead. */
static void chart(struct buf *b, json_t *minutes)
{
  long long now = num(minutes, "now");
  long long done[CHART_SLOTS] = { 0 }, dead[CHART_SLOTS] = { 0 }, retried[CHART_SLOTS] = { 0 };
  long long top = 1;
  json_t *rows = json_object_get(minutes, "rows"), *r;
  size_t i;
  json_array_foreach(rows, i, r) {
    long long slot = CHART_SLOTS - 1 - (now - num(r, "t")) / 60;
    if (slot < 0 || slot >= CHART_SLOTS)
      continue;
    done[slot] = num(r, "done"), dead[slot] = num(r, "dead"), retried[slot] = num(r, "retried");
    if (done[slot] + dead[slot] + retried[slot] > top)
      top = done[slot] + dead[slot] + retried[slot];
  }
  int w = CHART_SLOTS * CHART_SLOT_W;
  buf_printf(b, "<svg id=chart class=chart width=%d height=%d viewBox=\"0 0 %d %d\" role=img>"
                "<rect width=%d height=%d fill=\"#fafafa\" stroke=\"#cfd8dc\"/>",
             w, CHART_H + 14, w, CHART_H + 14, w, CHART_H);
  for (int s = 0; s < CHART_SLOTS; s++) {
    double y = CHART_H;
    const long long v[3] = { done[s], retried[s], dead[s] };
    static const char *const colour[3] = { DASH_COLOUR_DONE, DASH_COLOUR_RETRIED,
                                           DASH_COLOUR_DEAD };
    static const char *const what[3] = { "done", "retried", "dead" };
    for (int k = 0; k < 3; k++) {
      if (!v[k])
        continue;
      double hgt = (double)v[k] * (CHART_H - 4) / (double)top;
      y -= hgt;
      buf_printf(b, "<rect class=\"m-%s\" x=%d y=\"%.2f\" width=%d height=\"%.2f\" fill=\"%s\">"
                    "<title>%d min ago: %lld %s</title></rect>",
                 what[k], s * CHART_SLOT_W + 1, y, CHART_SLOT_W - 2, hgt, colour[k],
                 CHART_SLOTS - 1 - s, v[k], what[k]);
    }
  }
  buf_printf(b, "<text x=2 y=%d font-size=10>-60 min</text><text x=%d y=%d font-size=10 "
                "text-anchor=end>now · peak %lld/min</text></svg>",
             CHART_H + 12, w - 2, CHART_H + 12, top);
}

static void seconds(struct buf *b, json_t *v)
{
  if (json_is_number(v))
    buf_printf(b, "%.2f s", json_number_value(v));
  else
    buf_puts(b, "–");
}

/* "Tonight against last night": the shown batch's wall time, done, dead and p50 beside
   the previous batch's (dashboard_data.c's previous_fmt says which batch that is). */
static void compare(struct buf *b, json_t *rep, json_t *prev)
{
  buf_puts(b, "<h3>Against the previous batch</h3>");
  if (!json_is_object(prev)) {
    buf_puts(b, "<p class=empty id=previous>No earlier batch to compare with.</p>");
    return;
  }
  const char *name = json_string_value(json_object_get(prev, "batch"));
  const char *how = json_string_value(json_object_get(prev, "how"));
  buf_puts(b, "<p>");
  buf_puts(b, how && !strcmp(how, "name") ? "the previous batch of the same name (digits aside): "
                                          : "the previous run (no earlier batch of this name): ");
  buf_puts(b, "<a id=previous-batch href=\"/?batch=");
  url_escape(b, name);
  buf_puts(b, "\">");
  html_escape(b, name);
  buf_puts(b, "</a>");
  if (!json_is_true(json_object_get(prev, "settled")))
    buf_puts(b, " (still running)");
  buf_puts(b, "</p><table id=previous><tr><th></th><th>this batch</th><th>previous</th>"
              "<th>change</th></tr><tr><th>wall</th><td id=wall-this>");
  json_t *w1 = json_object_get(rep, "wall_s"), *w0 = json_object_get(prev, "wall_s");
  seconds(b, w1);
  buf_puts(b, "</td><td id=wall-previous>");
  seconds(b, w0);
  buf_puts(b, "</td><td>");
  /* A running batch's wall is the time so far: no change in per cent until it ends. */
  if (!json_is_true(json_object_get(rep, "settled")))
    buf_puts(b, "so far: this batch runs still");
  else if (json_is_number(w1) && json_is_number(w0) && json_number_value(w0) > 0)
    buf_printf(b, "%+.1f%%", 100 * (json_number_value(w1) / json_number_value(w0) - 1));
  buf_puts(b, "</td></tr>");
  static const char *const keys[] = { "total", "done", "dead" };
  for (size_t i = 0; i < 3; i++) {
    json_t *a = i ? json_object_get(json_object_get(rep, "counts"), keys[i])
                  : json_object_get(rep, "total");
    json_t *z = i ? json_object_get(json_object_get(prev, "counts"), keys[i])
                  : json_object_get(prev, "total");
    buf_printf(b, "<tr><th>%s</th><td>%lld</td><td id=\"prev-%s\">%lld</td><td>%+lld</td></tr>",
               keys[i], (long long)json_integer_value(a), keys[i],
               (long long)json_integer_value(z),
               (long long)(json_integer_value(a) - json_integer_value(z)));
  }
  buf_puts(b, "<tr><th>p50</th><td>");
  seconds(b, json_object_get(json_object_get(rep, "duration_s"), "p50"));
  buf_puts(b, "</td><td>");
  seconds(b, json_object_get(json_object_get(prev, "duration_s"), "p50"));
  buf_puts(b, "</td><td></td></tr></table>");
}

/* The batch shown: bar, counts, chart, durations, dead reasons, its actions. */
static void section_batch(struct buf *b, json_t *o)
{
  const char *name = json_string_value(json_object_get(o, "selected"));
  json_t *rep = json_object_get(o, "report");
  if (!name || !json_is_object(rep))
    return;
  json_t *k = json_object_get(rep, "counts");
  struct buf back = { 0 };
  buf_puts(&back, "/?batch=");
  url_escape(&back, name);
  buf_puts(b, "<section id=batch><h2>Batch <span id=batch-name>");
  html_escape(b, name);
  buf_printf(b, "</span></h2><p>total <b id=n-total>%lld</b> ", num(rep, "total"));
  counts(b, k, "n-");
  buf_puts(b, "</p>");
  bar(b, k, BAR_W, 28, "bar");
  /* A running batch's numbers (dashboard_data.c, live_fmt): exact counts; the rest read
     from its newest attempts, and the page says which. */
  json_t *live = json_object_get(rep, "live"), *mins = json_object_get(o, "minutes");
  if (json_is_true(json_object_get(mins, "from_attempts")))
    buf_printf(b, "<h3>Settles per minute, last hour (every attempt, from the attempt "
                  "history%s)</h3>",
               json_is_true(json_object_get(mins, "truncated"))
                 ? "; its newest attempts only, the older minutes left out" : "");
  else
    buf_puts(b, "<h3>Settled per minute, last hour (by each task's last settle)</h3>");
  chart(b, mins);
  /* Classes, not style attributes: the Content-Security-Policy allows no inline style. */
  buf_puts(b, "<p class=legend><i class=lg-done></i>done <i class=lg-retried></i>retried "
              "(waiting) <i class=lg-dead></i>dead</p>");
  json_t *d = json_object_get(rep, "duration_s");
  buf_printf(b, "<h3>Durations of done tasks</h3><p id=durations>%lld timed: p50 ",
             num(d, "count"));
  seconds(b, json_object_get(d, "p50"));
  buf_puts(b, ", p95 ");
  seconds(b, json_object_get(d, "p95"));
  buf_puts(b, ", max ");
  seconds(b, json_object_get(d, "max"));
  if (json_is_object(live)) {
    buf_puts(b, "; wall so far ");
    seconds(b, json_object_get(rep, "wall_s"));
    buf_printf(b, "</p><p class=note id=live-note>Running: the counts are exact; the "
                  "durations are those of the done attempts among the batch's newest %lld "
                  "attempts (of the queue's newest %lld: a sample), the wall so far starts "
                  "at the earliest claim among its first attempts to finish (approximate); "
                  "retries and tokens are counted once the batch finishes.",
               num(live, "attempts_limit"), num(live, "scan_limit"));
    if (num(live, "dead_read") < num(json_object_get(rep, "counts"), "dead"))
      buf_printf(b, " Dead reasons from %lld of its %lld dead tasks.", num(live, "dead_read"),
                 num(json_object_get(rep, "counts"), "dead"));
    buf_puts(b, "</p>");
  } else {
    buf_printf(b, "; %lld retries over %lld tasks; wall ", num(rep, "retries"),
               num(rep, "retried_tasks"));
    seconds(b, json_object_get(rep, "wall_s"));
    buf_puts(b, "</p>");
  }
  compare(b, rep, json_object_get(o, "previous"));
  json_t *reasons = json_object_get(rep, "dead_reasons"), *r, *id;
  size_t i, j;
  buf_puts(b, "<h3>Dead reasons</h3>");
  if (json_array_size(reasons) == 0)
    buf_puts(b, "<p class=empty>No dead task.</p>");
  else
    buf_puts(b, "<table id=dead-reasons><tr><th>tasks</th><th>reason</th><th>examples</th></tr>");
  json_array_foreach(reasons, i, r) {
    buf_printf(b, "<tr><td>%lld</td><td class=reason>", num(r, "count"));
    put_value(b, json_object_get(r, "reason"), 300);
    buf_puts(b, "</td><td>");
    json_array_foreach(json_object_get(r, "example_ids"), j, id)
      buf_printf(b, "<a class=task href=\"/task?id=%lld\">%lld</a> ", json_integer_value(id),
                 json_integer_value(id));
    buf_puts(b, "</td></tr>");
  }
  if (json_array_size(reasons) > 0)
    buf_puts(b, "</table>");
  json_t *usage = json_object_get(rep, "usage"), *u;
  buf_puts(b, "<h3>Tokens and cost (leash.usage and budgeted calls)</h3>");
  if (json_is_object(live))
    buf_puts(b, "<p class=empty>Counted once the batch finishes (a pass over its calls); "
                "leash report --batch counts them now.</p>");
  else if (json_array_size(usage) == 0)
    buf_puts(b, "<p class=empty>No usage recorded for this batch.</p>");
  else
    buf_puts(b, "<table id=usage><tr><th>budget</th><th>model</th><th>calls</th><th>input</th>"
                "<th>output</th><th>tokens</th><th>cost</th></tr>");
  json_array_foreach(usage, i, u) {
    static const char *const cols[] = { "budget", "model", "calls", "input_tokens",
                                        "output_tokens", "tokens", "cost" };
    buf_puts(b, "<tr>");
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
      buf_puts(b, "<td>");
      put_value(b, json_object_get(u, cols[c]), 200);
      buf_puts(b, "</td>");
    }
    buf_puts(b, "</tr>");
  }
  if (json_array_size(usage) > 0)
    buf_puts(b, "</table>");
  buf_puts(b, "<div class=actions>");
  const char *f[] = { "batch", name, NULL };
  action_form(b, "pause", "pause batch", back.s, f, 1);
  action_form(b, "resume", "resume batch", back.s, f, 0);
  action_form(b, "requeue", "requeue its dead", back.s, f, 0);
  action_form(b, "cancel", "cancel batch", back.s, f, 0);
  buf_puts(b, "</div></section>\n");
  buf_free(&back);
}

static void section_workers(struct buf *b, json_t *o)
{
  json_t *ws = json_object_get(o, "workers"), *w, *id;
  size_t i, j;
  buf_puts(b, "<section id=workers><h2>Workers (leases held now)</h2>");
  if (json_array_size(ws) == 0)
    buf_puts(b, "<p class=empty>No task is leased.</p>");
  else
    buf_puts(b, "<table><tr><th>worker</th><th>tasks</th><th>running</th></tr>");
  json_array_foreach(ws, i, w) {
    buf_puts(b, "<tr><td>");
    html_escape(b, json_string_value(json_object_get(w, "worker")));
    buf_printf(b, "</td><td>%lld</td><td>", num(w, "tasks"));
    json_array_foreach(json_object_get(w, "ids"), j, id)
      buf_printf(b, "<a class=task href=\"/task?id=%lld\">%lld</a> ", json_integer_value(id),
                 json_integer_value(id));
    buf_puts(b, "</td></tr>");
  }
  if (json_array_size(ws) > 0)
    buf_puts(b, "</table>");
  buf_puts(b, "</section>\n");
}

static void section_holds(struct buf *b, json_t *o)
{
  json_t *hs = json_object_get(o, "holds"), *h;
  size_t i;
  buf_puts(b, "<section id=holds><h2>Holds and pauses</h2>"
              "<form class=action id=pause-scope method=post action=\"/api/pause\">"
              "<input type=hidden name=html value=1><input type=hidden name=back value=\"/\">"
              "<select name=kind><option>tenant</option><option>batch</option>"
              "<option>budget</option></select><input name=scope placeholder=name required>"
              "<input name=for placeholder=\"for (10m)\" size=7>"
              "<input type=password name=token placeholder=token size=10 required>"
              "<button type=submit data-action=pause>pause</button></form>");
  if (json_array_size(hs) == 0)
    buf_puts(b, "<p class=empty>Nothing is held.</p>");
  else
    buf_puts(b, "<table><tr><th>kind</th><th>scope</th><th>by</th><th>left</th><th>reason</th>"
                "<th></th></tr>");
  json_array_foreach(hs, i, h) {
    const char *kind = json_string_value(json_object_get(h, "kind"));
    const char *scope = json_string_value(json_object_get(h, "scope"));
    buf_puts(b, "<tr><td>");
    html_escape(b, kind);
    buf_puts(b, "</td><td class=scope>");
    html_escape(b, scope);
    buf_puts(b, "</td><td>");
    html_escape(b, json_string_value(json_object_get(h, "by")));
    buf_puts(b, "</td><td>");
    json_t *left = json_object_get(h, "left_s");
    if (json_is_number(left))
      seconds(b, left);
    else
      buf_puts(b, "until resumed");
    buf_puts(b, "</td><td>");
    put_value(b, json_object_get(h, "reason"), 300);
    buf_puts(b, "</td><td>");
    if (kind && scope && (!strcmp(kind, "batch") || !strcmp(kind, "tenant") ||
                          !strcmp(kind, "budget"))) {
      const char *f[] = { kind, scope, NULL };
      action_form(b, "resume", "resume", "/", f, 0);
    }
    buf_puts(b, "</td></tr>");
  }
  if (json_array_size(hs) > 0)
    buf_puts(b, "</table>");
  buf_puts(b, "</section>\n");
}

static void section_budgets(struct buf *b, json_t *o)
{
  json_t *bs = json_object_get(o, "budgets"), *x;
  size_t i;
  buf_puts(b, "<section id=budgets><h2>Budgets</h2>");
  if (json_array_size(bs) == 0)
    buf_puts(b, "<p class=empty>No budget is set (leash budget set).</p>");
  else
    buf_puts(b, "<table><tr><th>budget</th><th>calls / rpm</th><th>tokens / tpm</th>"
                "<th>in flight</th><th>paused</th></tr>");
  json_array_foreach(bs, i, x) {
    buf_puts(b, "<tr><td>");
    html_escape(b, json_string_value(json_object_get(x, "name")));
    buf_printf(b, "</td><td>%lld / ", num(x, "calls"));
    put_value(b, json_object_get(x, "rpm"), 40);
    buf_printf(b, "</td><td>%lld / ", num(x, "tokens"));
    put_value(b, json_object_get(x, "tpm"), 40);
    buf_printf(b, "</td><td>%lld</td><td>", num(x, "in_flight"));
    json_t *p = json_object_get(x, "paused_s");
    if (json_is_number(p))
      seconds(b, p);
    else
      buf_puts(b, "no");
    buf_puts(b, "</td></tr>");
  }
  if (json_array_size(bs) > 0)
    buf_puts(b, "</table>");
  buf_puts(b, "</section>\n");
}

/* The latest canaries: state, share, the candidate against the current version, the
   verdict and its reason (as leash canary status). */
static void section_canaries(struct buf *b, json_t *o)
{
  json_t *cs = json_object_get(o, "canaries"), *x;
  size_t i;
  buf_puts(b, "<section id=canaries><h2>Canaries</h2>");
  if (json_array_size(cs) == 0) {
    buf_puts(b, "<p class=empty>No canary was started (leash canary start).</p></section>\n");
    return;
  }
  buf_puts(b, "<table><tr><th>id</th><th>state</th><th>script</th><th>version</th>"
              "<th>share</th><th>candidate</th><th>current</th><th>verdict</th>"
              "<th>reason</th></tr>");
  json_array_foreach(cs, i, x) {
    json_t *n = json_object_get(x, "numbers");
    buf_printf(b, "<tr class=canary><td>%lld</td><td class=state>", num(x, "id"));
    html_escape(b, json_string_value(json_object_get(x, "state")));
    buf_puts(b, "</td><td>");
    put_value(b, json_object_get(x, "script_name"), 200);
    buf_puts(b, "</td><td>");
    put_value(b, json_object_get(x, "version"), 12);
    if (json_is_string(json_object_get(x, "label"))) {
      buf_puts(b, " (");
      put_value(b, json_object_get(x, "label"), 64);
      buf_puts(b, ")");
    }
    buf_printf(b, "</td><td>%lld%%</td><td class=candidate>%lld failed, %lld retried of %lld"
                  "</td><td class=current>%lld failed, %lld retried of %lld</td>"
                  "<td class=verdict>",
               num(x, "share"), num(n, "candidate_failed"), num(n, "candidate_retried"),
               num(n, "candidate_executions"), num(n, "current_failed"),
               num(n, "current_retried"), num(n, "current_executions"));
    put_value(b, json_object_get(n, "verdict"), 40);
    buf_puts(b, "</td><td class=reason>");
    put_value(b, json_object_get(n, "reason"), 300);
    buf_puts(b, "</td></tr>");
  }
  buf_puts(b, "</table></section>\n");
}

/* The overview's sections, in page order: one more kind of data is one more entry. */
static void (*const overview_sections[])(struct buf *, json_t *) = {
  section_batch, section_batches, section_workers, section_holds, section_budgets,
  section_canaries,
};

char *dash_overview_html(const char *overview, const char *table, int refresh)
{
  json_t *o = json_loads(overview, 0, NULL);
  if (!o)
    return NULL;
  struct buf b = { 0 };
  head(&b, "overview", table, refresh);
  const char *shown = json_string_value(json_object_get(o, "selected"));
  buf_puts(&b, "<p class=refresh>");
  if (refresh > 0)
    buf_printf(&b, "reloads every %d s · <a id=refresh-off href=\"/", refresh);
  else
    buf_puts(&b, "<a id=refresh-on href=\"/?refresh=10");
  if (shown) {
    buf_puts(&b, refresh > 0 ? "?batch=" : "&amp;batch=");
    url_escape(&b, shown);
  }
  buf_puts(&b, refresh > 0 ? "\">stop reloading</a></p>" : "\">reload every 10 s</a></p>");
  for (size_t i = 0; i < sizeof overview_sections / sizeof overview_sections[0]; i++)
    overview_sections[i](&b, o);
  json_decref(o);
  return finish(&b);
}

/* A task's attempt history (sql/016), oldest first: one row per execution. */
static void attempts(struct buf *b, json_t *o)
{
  json_t *as = json_object_get(o, "attempts"), *a;
  size_t i;
  buf_printf(b, "<h3>Attempts</h3><p>%lld execution%s recorded", num(o, "attempts_total"),
             num(o, "attempts_total") == 1 ? "" : "s");
  if ((long long)json_array_size(as) < num(o, "attempts_total"))
    buf_printf(b, " (the newest %zu shown)", json_array_size(as));
  buf_puts(b, ".</p>");
  if (json_array_size(as) == 0)
    return;
  buf_puts(b, "<table id=attempts><tr><th>attempt</th><th>worker</th><th>version</th>"
              "<th>kind</th><th>cause</th><th>status after</th><th>queue wait</th>"
              "<th>run</th><th>finished</th><th>error</th></tr>");
  json_array_foreach(as, i, a) {
    buf_printf(b, "<tr class=attempt><td class=n>%lld</td><td class=worker>", num(a, "attempt"));
    put_value(b, json_object_get(a, "worker"), 200);
    buf_puts(b, "</td><td class=version>");
    put_value(b, json_object_get(a, "version"), 12);
    if (json_is_string(json_object_get(a, "label"))) {
      buf_puts(b, " (");
      put_value(b, json_object_get(a, "label"), 64);
      buf_puts(b, ")");
    }
    buf_puts(b, "</td><td class=kind>");
    put_value(b, json_object_get(a, "kind"), 40);
    if (json_is_true(json_object_get(a, "crashed")))
      buf_puts(b, " (crash)");
    buf_puts(b, "</td><td class=cause>");
    put_value(b, json_object_get(a, "cause"), 64);
    buf_puts(b, "</td><td>");
    put_value(b, json_object_get(a, "status"), 16);
    buf_puts(b, "</td><td>");
    seconds(b, json_object_get(a, "queue_wait_s"));
    buf_puts(b, "</td><td>");
    seconds(b, json_object_get(a, "run_s"));
    buf_puts(b, "</td><td>");
    put_value(b, json_object_get(a, "finished_at"), 64);
    buf_puts(b, "</td><td class=error><pre>");
    put_value(b, json_object_get(a, "error"), 2000);
    buf_puts(b, "</pre></td></tr>");
  }
  buf_puts(b, "</table>");
}

char *dash_task_html(const char *task, const char *table)
{
  json_t *o = json_loads(task, 0, NULL);
  if (!o)
    return NULL;
  json_t *row = json_object_get(o, "task"), *v, *s;
  long long id = num(row, "id");
  const char *status = json_string_value(json_object_get(row, "status"));
  char title[48], back[48], ids[32];
  snprintf(title, sizeof title, "task %lld", id);
  snprintf(back, sizeof back, "/task?id=%lld", id);
  snprintf(ids, sizeof ids, "%lld", id);
  struct buf b = { 0 };
  head(&b, title, table, 0);
  buf_printf(&b, "<section id=task><h2>Task %lld <span id=task-status class=\"st-", id);
  html_escape(&b, status);
  buf_puts(&b, "\">");
  html_escape(&b, status);
  buf_puts(&b, "</span></h2><div class=actions>");
  const char *f[] = { "id", ids, NULL };
  if (status && !strcmp(status, "dead"))
    action_form(&b, "requeue", "requeue", back, f, 0);
  if (status && (!strcmp(status, "pending") || !strcmp(status, "leased")))
    action_form(&b, "cancel", "cancel", back, f, 0);
  buf_puts(&b, "</div><h3>Last error</h3><pre id=last-error>");
  put_value(&b, json_object_get(row, "last_error"), PAYLOAD_SHOWN);
  buf_puts(&b, "</pre><h3>Row</h3><table class=row>");
  const char *key;
  json_object_foreach(row, key, v) {
    if (!strcmp(key, "last_error"))
      continue;
    buf_puts(&b, "<tr><th>");
    html_escape(&b, key);
    buf_puts(&b, "</th><td><pre>");
    put_value(&b, v, PAYLOAD_SHOWN);
    buf_puts(&b, "</pre></td></tr>");
  }
  buf_puts(&b, "</table><h3>Steps</h3>");
  json_t *steps = json_object_get(o, "steps");
  size_t i;
  if (json_array_size(steps) == 0)
    buf_puts(&b, "<p class=empty>No stored step.</p>");
  else
    buf_puts(&b, "<table><tr><th>step</th><th>attempt</th><th>at</th><th>result</th></tr>");
  json_array_foreach(steps, i, s) {
    buf_puts(&b, "<tr><td>");
    put_value(&b, json_object_get(s, "name"), 200);
    buf_printf(&b, "</td><td>%lld</td><td>", num(s, "attempt"));
    put_value(&b, json_object_get(s, "created_at"), 64);
    buf_puts(&b, "</td><td><pre>");
    put_value(&b, json_object_get(s, "result"), 2000);
    buf_puts(&b, "</pre></td></tr>");
  }
  if (json_array_size(steps) > 0)
    buf_puts(&b, "</table>");
  attempts(&b, o);
  buf_puts(&b, "</section>\n");
  json_decref(o);
  return finish(&b);
}

char *dash_message_html(int status, const char *message, const char *back)
{
  /* A local path only: an absolute URL or //host would make the link an open redirect. */
  if (!back || back[0] != '/' || back[1] == '/' || back[1] == '\\')
    back = "/";
  struct buf b = { 0 };
  head(&b, status < 300 ? "done" : "refused", "", 0);
  buf_printf(&b, "<section id=result class=\"r%d\"><h2>%s</h2><p id=message>", status,
             status < 300 ? "Done" : "Refused");
  html_escape(&b, message);
  buf_puts(&b, "</p><p><a id=back href=\"");
  html_escape(&b, back);
  buf_puts(&b, "\">back</a></p></section>\n");
  return finish(&b);
}
