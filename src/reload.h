/*
 * reload: hot swap. A thread watches the script's folder and every --lua-path folder with
 * inotify (editors save by writing a temporary file and renaming it over the old one, so
 * folders are watched, not files, and bursts of events are coalesced for 200 ms), and also
 * acts on SIGHUP (reload_request). It loads the new version once as a probe: a version that
 * fails to load or to pass the contract is refused with a logged error and the slots keep
 * the old one; a good one bumps the host's generation, and each slot loads it between tasks.
 */
#ifndef LEASH_RELOAD_H
#define LEASH_RELOAD_H

#include "metrics.h"
#include "script.h"

#include <pthread.h>
#include <stddef.h>

struct reload;

/* The script text the slots load, and its version: written by reload.c (a new generation for
   each version that loads), read by the slots between tasks and by metrics. Guarded by the
   owner's mutex (reload_config.mu). */
struct script_source {
  unsigned generation;
  char *text;
  size_t len;
  char version[SCRIPT_VERSION_LEN + 1];
  /* The canary's candidate (canary.c publishes it; share 0 and text NULL: none). Slots load
     it as a second state when canary_generation moves. */
  unsigned canary_generation;
  char *canary_text;
  size_t canary_len;
  char canary_version[SCRIPT_VERSION_LEN + 1];
  int canary_share;
  long long canary_id;
};

struct reload_config {
  const char *script_path;
  const char *const *lua_path;   /* watched as well as the script's folder */
  int nlua_path;
  const struct script_host *sh;  /* what each probe load gets */
  double load_limit;             /* reload_load_bounded's limit */
  pthread_mutex_t *mu;           /* guards *src */
  struct script_source *src;
  struct metrics_counters *counters;   /* reloads_loaded, reloads_refused */
};

/* NULL (logged) when inotify or the thread cannot start; hot swap then works by SIGHUP only
   if the caller falls back to reload_request... so the host treats NULL as a start failure.
   cfg is copied; what it points to must outlive reload_stop. */
struct reload *reload_start(const struct reload_config *cfg);
/* Asks for a reload now (SIGHUP); async-signal-safe. */
void reload_request(struct reload *r);
void reload_stop(struct reload *r);

/* Loads a version (script_load_text) on a thread of its own and waits at most limit_s for
   it. script.c's count hook bounds a setup that loops in Lua, but not one wedged inside a
   single C call (a sort, a find): past limit_s the load is refused with err "setup did not
   return within ...", the caller goes on, and the stuck thread is abandoned. It frees its
   state if it ever returns; until then it holds a core (reload_loaders_stuck counts it).
   text is copied. Used for every load of `leash run`: the start probe, each slot's first
   state, hot-swap probes and each slot's reload between tasks. */
struct script *reload_load_bounded(const char *path, const char *text, size_t len,
                                   const struct script_host *sh, double limit_s, char *err,
                                   size_t errlen);

/* Loads abandoned by reload_load_bounded that have not returned yet. */
int reload_loaders_stuck(void);

#endif
