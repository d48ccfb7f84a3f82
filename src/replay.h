/*
 * replay: one task's recording (sql/017, record.h) served back to a script, and the
 * comparison of what the script now does with what the recording says it did
 * (`leash replay`, cmd_replay.c; README "Replay").
 *
 * The hook is narrow: a state whose host has a replay source (script_host.replay, set only by
 * `leash replay`) has leash.http.request, leash.db.query, leash.step, leash.enqueue and
 * leash.sleep answered here instead of doing I/O. Everything before the answer (argument
 * checks, the live-task check) is the real API's own code, so the script runs the C paths it
 * runs under `leash run`. A request the recording does not hold is a divergence: it is kept
 * in the source (the first one) and the run is stopped as the host stops a task
 * (taskctx_yield: a script's pcall cannot swallow it).
 *
 * Matching is the fixture's (cmd_fixture.c): an HTTP request takes the first unused recorded
 * exchange of the same method and URL, else the next unused one of that method (a changed
 * prompt is the same call with another body); a statement the first unused recorded answer
 * to the same text; a step the recorded result when an earlier attempt had stored it (else
 * its function runs); an enqueue the next recorded child's id. URLs and statements are
 * redacted as the recording redacted them (record_redact) before they are compared, so a
 * request carrying an --env-allow value matches its recorded, redacted form.
 *
 * One source per job (thread): not shared.
 */
#ifndef LEASH_REPLAY_H
#define LEASH_REPLAY_H

#include <lua.h>
#include <stddef.h>

struct json_t;
struct replay_src;
struct script;

struct replay_src *replay_src_new(void);
void replay_src_free(struct replay_src *s);

/* The API answers (api_http.c, api_leash.c), each after the real function checked its
   arguments. They push what the real function returns, raise as it raises on a recorded
   failure, or stop the run as a divergence. */
int replay_http(lua_State *L, struct replay_src *s, const char *method, const char *url);
int replay_db(lua_State *L, struct replay_src *s, const char *sql);
/* 1 with the stored result pushed when the recording says an earlier attempt had stored
   step name; 0 when its function is to run (nothing pushed). */
int replay_step(lua_State *L, struct replay_src *s, const char *name);
int replay_enqueue(lua_State *L, struct replay_src *s);

/* One recorded execution (a recording's body as JSON text) run through script s, whose
   host's replay is src, and compared. Returns a new object: {id, change: "same" | "outcome"
   | "result" | "divergence" | "unreadable", from: {kind, status, cause, result}, to: {...,
   error}, divergence}; every text in it redacted. NULL on no memory. The caller reloads s
   when script_broken(s) afterwards, as a slot does. */
struct json_t *replay_one(struct script *s, struct replay_src *src, const char *body,
                          size_t len);

/* "ok", "retry", "fatal", "snooze" of a recorded kind ("done", "retry", "dead", "snooze"). */
const char *replay_kind_word(const char *kind_sql);

#endif
