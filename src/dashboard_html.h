/*
 * dashboard_html: the dashboard's HTML, drawn from the JSON of dashboard_data (so the page
 * and /api/ show the same numbers). No script: charts are SVG drawn here, actions are forms.
 * Every value from the database goes through html_escape (payloads, errors, tenant and
 * batch names are hostile input). A page is a list of sections, each a function of the
 * overview's JSON: a new kind of data (attempt history, canaries) is one more section.
 */
#ifndef LEASH_DASHBOARD_HTML_H
#define LEASH_DASHBOARD_HTML_H

#include "buf.h"

/* Appends s with &, <, >, " and ' replaced by entities (safe in text and quoted attributes). */
void html_escape(struct buf *b, const char *s);

/* The overview page of overview (dash_overview_json's text); table names the queue; refresh:
   seconds between reloads (a meta refresh: no script), 0 for none. NULL when out of memory
   or the JSON cannot be read. malloc'd. */
char *dash_overview_html(const char *overview, const char *table, int refresh);

/* One task's page (dash_task_json's text). */
char *dash_task_html(const char *task, const char *table);

/* A page with one message (an action's result, an error) and a link to back ("/" unless a
   local path). status: the HTTP status it goes with, shown. */
char *dash_message_html(int status, const char *message, const char *back);

/* The colours of the bar and the chart (the browser test looks for them in the screenshot). */
#define DASH_COLOUR_DONE "#2e7d32"
#define DASH_COLOUR_DEAD "#c62828"
#define DASH_COLOUR_LEASED "#1565c0"
#define DASH_COLOUR_PENDING "#b0bec5"
#define DASH_COLOUR_RETRIED "#ef6c00"

#endif
