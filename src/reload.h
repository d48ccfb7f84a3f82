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

struct host;
struct reload;

/* NULL (logged) when inotify or the thread cannot start; hot swap then works by SIGHUP only
   if the caller falls back to reload_request... so the host treats NULL as a start failure. */
struct reload *reload_start(struct host *h);
/* Asks for a reload now (SIGHUP); async-signal-safe. */
void reload_request(struct reload *r);
void reload_stop(struct reload *r);

#endif
