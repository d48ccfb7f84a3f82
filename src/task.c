/* task: freeing a task and the clock. See task.h. */
#include "task.h"

#include "record.h"

#include <stdlib.h>
#include <time.h>

void task_free(struct task *t)
{
  if (!t)
    return;
  free(t->tenant_id);
  free(t->shard_key);
  free(t->batch);
  free(t->payload);
  outcome_clear(&t->out);
  record_free(t->rec);
  free(t);
}

int task_lease_alive(const struct task *t)
{
  /* Only reads: the lease thread or the dispatcher marks the loss and logs why. */
  return !atomic_load(&t->lost) && task_now() < atomic_load(&t->lease_deadline);
}

double task_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
