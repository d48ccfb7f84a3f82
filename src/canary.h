/*
 * canary: each `leash run` follows the table's canary (sql/018_canary.sql). A thread polls
 * <table>_canary_poll every CANARY_POLL_S while a canary runs, every CANARY_IDLE_POLL_S
 * otherwise, and at once when poked (`leash canary` sends NOTIFY "canary" on the queue's
 * channel, which the lease thread hears): an idle worker costs the database little and still
 * adopts a new canary at once. That call may take the fleet's one verdict (the
 * first process to lock the running row does) and keeps giving back the failed attempts of a
 * recent rollback. A new running canary's text is loaded once as a probe (its modules from
 * this process's folders) and must reproduce the recorded version; it is then published in
 * script_source (canary_*) and each slot loads it as a second state beside the current one.
 * A task runs the candidate when canary_picks(its id): the same answer in every process and
 * for every attempt. Promotion makes the candidate's text the current script (as a hot swap
 * does; the file on disk is not touched), rollback and abort drop it; each process logs the
 * decision it applies with the numbers stored in the table.
 */
#ifndef LEASH_CANARY_H
#define LEASH_CANARY_H

#include "db.h"
#include "metrics.h"
#include "reload.h"
#include "script.h"

#include <pthread.h>
#include <stdint.h>

#define CANARY_POLL_S 0.5
#define CANARY_IDLE_POLL_S 5.0

struct canary_config {
  const char *conninfo;
  const struct db_table *table;
  const char *script_path;       /* the candidate's chunk name and module folder */
  const struct script_host *sh;  /* what the probe load gets */
  double load_limit;
  pthread_mutex_t *mu;           /* guards *src */
  struct script_source *src;
  struct metrics_counters *counters;   /* canary_rollbacks, canary_promotions, canary_share */
};

struct canary;

/* NULL (logged) when the thread cannot start. cfg is copied; what it points to must
   outlive canary_stop. */
struct canary *canary_start(const struct canary_config *cfg);
/* Polls now (any thread; c may be NULL). */
void canary_poke(struct canary *c);
void canary_stop(struct canary *c);

/* 1 when task id runs canary canary_id's candidate at share percent: a hash of both, so a
   new canary picks other tasks, every pod agrees and a retried task keeps its version. */
int canary_picks(int64_t id, long long canary_id, int share);

/* The table's canary for people (leash canary status, leash status): the running one, else
   the latest, as one JSON object (malloc'd text; "null" when there is none), its numbers
   computed now while it runs, those it was decided on after. NULL with err. */
char *canary_status_json(PGconn *c, const struct db_table *t, char *err, size_t errlen);

#endif
