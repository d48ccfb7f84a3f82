/*
 * task: one leased row while this process holds it, from claim to settle. The dispatcher
 * creates it from a claimed row and frees it after settling; a slot owns it while the script
 * runs; the lease thread reads id/token and may set `lost` at any time (atomic).
 */
#ifndef LEASH_TASK_H
#define LEASH_TASK_H

#include "outcome.h"

#include <stdatomic.h>
#include <stdint.h>

/* The longest label a script may declare (its module's `label` field, docs/lua-api.md). */
#define TASK_LABEL_MAX 64

struct task {
  int64_t id;
  int attempt;            /* attempts after our claim (what the script sees) */
  int64_t token;          /* the claim's lease token: every write of this lease is fenced by it */
  int max_attempts;
  char *tenant_id;
  char *shard_key;
  char *batch;            /* NULL when the row has none */
  char *payload;          /* JSON text */
  double claimed_at;      /* monotonic seconds */
  double run_start;       /* monotonic seconds when handle started; 0 until it does */
  double waited;          /* seconds from runnable to claim (pickup latency), server clock */
  /* What ran it, for the attempt history (sql/016): the script's version (script.h's 64 hex
     digits) and its label (TASK_LABEL_MAX bytes at most); both "" until a script runs it. */
  char version[64 + 1];
  char label[TASK_LABEL_MAX + 1];
  /* Monotonic: past it, with no renewal, the lease counts as lost. Moved by the lease
     thread, read by the slot before every side effect: atomic. */
  _Atomic double lease_deadline;
  atomic_int lost;        /* set by the lease thread, a slot or drain; never cleared */
  int finished;           /* the script is done and the outcome awaits settle (under the
                             lease registry's lock) */

  /* Filled by the slot after the script ran (or by the watchdog for a wedged slot). */
  struct outcome out;
  double duration;        /* seconds the script ran */

  struct record *rec;     /* what this execution did (record.h), or NULL: not recorded */

  struct task *next;      /* intrusive list link, owned by whichever list holds it */
};

void task_free(struct task *t);

/* 1 while the lease may still be ours: not marked lost and not past its deadline (a
   process frozen past its lease must not go on writing before the lease thread notices). */
int task_lease_alive(const struct task *t);

/* Monotonic clock in seconds. */
double task_now(void);

#endif
