/*
 * script_fixture: what the C tests of the script side (test_script, test_boundary,
 * test_sandbox) share: a host to lend a state, and a task as the dispatcher would hand it
 * over (leased for an hour, nothing settled). Header-only: each test binary is one file.
 */
#ifndef LEASH_TEST_SCRIPT_FIXTURE_H
#define LEASH_TEST_SCRIPT_FIXTURE_H

#include "script.h"
#include "task.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_int fixture_stopping;
static pthread_mutex_t fixture_wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fixture_wake_cv = PTHREAD_COND_INITIALIZER;

static inline struct script_host fixture_host(double timeout, size_t memory, size_t max_result)
{
  atomic_init(&fixture_stopping, 0);
  return (struct script_host){
    .worker_id = "test-worker", .stopping = &fixture_stopping, .wake_mu = &fixture_wake_mu,
    .wake_cv = &fixture_wake_cv, .task_timeout = timeout, .memory_limit = memory,
    .max_result_bytes = max_result,
  };
}

static inline struct task *fixture_task(int64_t id, const char *tenant, const char *payload)
{
  struct task *t = calloc(1, sizeof *t);
  t->id = id;
  t->attempt = 1;
  t->max_attempts = 8;
  t->tenant_id = strdup(tenant);
  t->shard_key = strdup("s");
  t->payload = strdup(payload);
  t->out.delay = -1;
  atomic_init(&t->lost, 0);
  atomic_init(&t->lease_deadline, task_now() + 3600);
  return t;
}

#endif
