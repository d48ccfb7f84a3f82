/*
 * record: what one execution of a task did, kept in memory while it runs and stored in
 * <table>_recordings once its settle is known (sql/017), so `leash fixture ID` can turn a
 * dead task into a busted spec (cmd_fixture.c).
 *
 * The policy, the size cap and the redaction patterns are set once by `leash run` before
 * any thread starts (like secrets.h) and only read afterwards. A recording belongs to its
 * task (task->rec): the slot's thread adds to it while the script runs (api_http.c,
 * api_leash.c call the record_* hooks, which do nothing when the task has no recording), the
 * dispatcher stores and frees it after the settle. Every text is redacted as it is added,
 * never later: the credential headers by name, every leash.env value (secrets.h) and the
 * --record-redact patterns. Nothing here raises into Lua or fails a task: a recording that
 * cannot grow (the cap, no memory) is marked truncated and stops adding.
 */
#ifndef LEASH_RECORD_H
#define LEASH_RECORD_H

#include <libpq-fe.h>
#include <lua.h>
#include <stddef.h>

struct task;
struct db_table;
struct record;

enum record_policy { RECORD_NONE, RECORD_DEAD, RECORD_ALL };

#define RECORD_DEFAULT_MAX ((size_t)1 << 20)
#define RECORD_MAX_PATTERNS 32

/* "none", "dead" or "all" into *p: 0, or -1. */
int record_parse_policy(const char *s, enum record_policy *p);
/* Compiles one --record-redact POSIX extended regex: 0, or -1 with a message in err. */
int record_add_pattern(const char *regex, char *err, size_t errlen);
/* Names of --env-allow, kept so a fixture can allow the same names (their values are never
   kept). list is comma-separated, as given. */
void record_note_env(const char *list);
/* The policy and the per-task cap (bytes); script_path goes into each recording. */
void record_configure(enum record_policy p, size_t max_bytes, const char *script_path);
/* Forgets everything (tests; before threads start or after they end). */
void record_reset(void);
enum record_policy record_policy(void);

/* A malloc'd copy of s (len bytes) with every leash.env value and every --record-redact match
   replaced by "[redacted]"; NULL on no memory. */
char *record_redact(const char *s, size_t len);

/* Starts t's recording (t->rec) when the policy records anything; version is the script's. */
void record_begin(struct task *t, const char *version);
void record_free(struct record *r);

/* The hooks; each does nothing when t has no recording. Lua values are read raw, never
   with metamethods, and nothing is left on the stack. */

/* One leash.http.request: headers at hidx (a table, or 0 for none); the response table
   {status, headers, body} at ridx, or error (a transport failure) when ridx is 0. */
void record_http(struct task *t, lua_State *L, const char *method, const char *url, int hidx,
                 const char *body, size_t body_len, int ridx, const char *error);
/* One leash.db.query: params as sent (NULL for NULL); the rows table at ridx and the rows
   affected, or error when ridx is 0. */
void record_db(struct task *t, lua_State *L, const char *sql, int nparams,
               const char *const *params, int ridx, long long affected, const char *error);
/* One leash.step: its result at vidx; cached when an earlier attempt had stored it. */
void record_step(struct task *t, lua_State *L, const char *name, int cached, int vidx);
/* One leash.enqueue: the child's id and payload (JSON text). */
void record_enqueue(struct task *t, long long id, const char *payload_json);

/* After t's settle: applied is what the fenced write did (SETTLED_*, or -1 for not
   written). Stores the recording when the policy keeps this execution, on c (the claim
   connection; one INSERT). Logs a warning when the row cannot be written; never fails. */
void record_store(PGconn *c, const struct db_table *tbl, struct task *t, int applied);

#endif
