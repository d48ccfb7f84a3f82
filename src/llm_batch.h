/*
 * llm_batch: the fleet's one batcher for leash.llm.batch (sql/022_llm_batch.sql,
 * docs/ARCHITECTURE.md "Provider batches"). Every `leash run` starts this thread; it leads
 * while it holds a session advisory lock of the table's on its own connection, so exactly
 * one process of the fleet submits and polls, and when that process dies its session ends,
 * the lock is free and the next thread to try (every LLM_BATCH_FOLLOW_S) leads. A new leader
 * first abandons the batches its predecessor left half-made (items back to pending).
 *
 * Leading, each tick: for each provider, while <table>_llm_batch_open hands out a batch
 * (--llm-batch-max items pending, or the oldest --llm-batch-age old), upload it (OpenAI:
 * POST /v1/files then /v1/batches; Anthropic: POST /v1/messages/batches) and store the
 * provider's batch id; then each open batch not polled for --llm-batch-poll is polled, and
 * an ended one's results are fetched and handed to <table>_llm_batch_end, which answers the
 * items and wakes their tasks in one transaction. JSON is made and read in SQL; this file
 * moves bytes. Keys come from this process's OPENAI_API_KEY / ANTHROPIC_API_KEY and go in a
 * header only: never in a log line, an error or the database. Provider ids are checked to
 * be [A-Za-z0-9_-] before they go into a URL, and results are fetched from the configured
 * base URL, never from a URL the provider names (a key must not travel elsewhere).
 */
#ifndef LEASH_LLM_BATCH_H
#define LEASH_LLM_BATCH_H

#include "db.h"

#define LLM_BATCH_TICK_S 0.5       /* a leader with work */
#define LLM_BATCH_IDLE_MAX_S 10.0  /* a leader with nothing open or due (see next_wait) */
#define LLM_BATCH_FOLLOW_S 5.0     /* a follower, between tries for the lead */
#define LLM_PROVIDERS 2   /* LLM_OPENAI, LLM_ANTHROPIC */
enum { LLM_OPENAI, LLM_ANTHROPIC };

struct llm_batch_options {
  const char *url[LLM_PROVIDERS];   /* --llm-batch-url P=URL: base URLs; NULL the public API */
  int max;                          /* --llm-batch-max: items per provider batch */
  double age_s;                     /* --llm-batch-age: the longest an item waits for a batch */
  double poll_s;                    /* --llm-batch-poll: between two polls of one batch */
  int off;                          /* --llm-batch-off: this process never leads */
};
#define LLM_BATCH_DEFAULTS { { NULL, NULL }, 1000, 60, 30, 0 }

struct llm_batch_config {
  const char *conninfo;
  const struct db_table *table;
  const char *worker_id;
  struct llm_batch_options opt;
};

struct llm_batch;

/* The provider's index for name ("openai", "anthropic"), or -1. */
int llm_provider_index(const char *name, size_t len);

/* NULL (logged) when the thread cannot start, or when opt.off. cfg is copied; what it
   points to must outlive llm_batch_stop. */
struct llm_batch *llm_batch_start(const struct llm_batch_config *cfg);
void llm_batch_stop(struct llm_batch *b);

#endif
