/*
 * test_lease: the lease unit alone, with no host. The registry (add, remove, count, give up)
 * and the lease thread's one duty that needs no database: a held lease past its deadline is
 * reported lost through on_lost (a process that could not renew must assume the worst),
 * once, and a finished or already lost one too but through the same single callback.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"
#include "lease.h"

static struct task *new_task(int64_t id, int attempt, double deadline)
{
  struct task *t = calloc(1, sizeof *t);
  CHECK(t != NULL);
  t->id = id;
  t->attempt = attempt;
  t->token = 1000 + attempt;
  atomic_init(&t->lease_deadline, deadline);
  atomic_init(&t->lost, 0);
  return t;
}

static void registry_counts_adds_and_removes_in_any_order(void)
{
  enum { N = 1000 };
  struct lease_registry *r = lease_registry_new();
  CHECK(r != NULL);
  static struct task *ts[N];
  for (int i = 0; i < N; i++) {
    ts[i] = new_task(i + 1, 1, 1e18);
    lease_registry_add(r, ts[i]);
  }
  CHECK_INT_EQ(lease_registry_count(r), N);
  for (int i = 0; i < N; i += 2)
    lease_registry_remove(r, ts[i]);
  lease_registry_remove(r, ts[0]);   /* twice: nothing happens */
  CHECK_INT_EQ(lease_registry_count(r), N / 2);
  int n = -1;
  struct lease_key *keys = lease_registry_give_up(r, NULL, &n);
  CHECK_INT_EQ(n, N / 2);
  for (int i = 0; i < n; i++)
    CHECK(keys[i].id % 2 == 0);   /* ids 2, 4, ...: the odd indexes stayed */
  free(keys);
  for (int i = 0; i < N; i++)
    free(ts[i]);
  lease_registry_free(r);
}

static void give_up_marks_all_lost_but_the_kept_and_the_already_lost(void)
{
  struct lease_registry *r = lease_registry_new();
  struct task *a = new_task(1, 3, 1e18), *b = new_task(2, 1, 1e18), *c = new_task(3, 2, 1e18);
  lease_registry_add(r, a);
  lease_registry_add(r, b);
  lease_registry_add(r, c);
  atomic_store(&c->lost, 1);   /* lost already: not ours to give back */
  int n = -1;
  struct lease_key *keys = lease_registry_give_up(r, b, &n);
  CHECK_INT_EQ(n, 1);
  CHECK_INT_EQ(keys[0].id, 1);
  CHECK_INT_EQ(keys[0].token, 1003);
  CHECK_INT_EQ(atomic_load(&a->lost), 1);
  CHECK_INT_EQ(atomic_load(&b->lost), 0);   /* the kept one (a wedged task) is settled */
  free(keys);
  keys = lease_registry_give_up(r, b, &n);   /* all lost but b now: nothing to give */
  CHECK(keys == NULL);
  CHECK_INT_EQ(n, 0);
  CHECK_INT_EQ(lease_registry_count(r), 3);   /* giving up does not forget: settle removes */
  lease_registry_finished(r, a);
  CHECK_INT_EQ(a->finished, 1);
  free(a), free(b), free(c);
  lease_registry_free(r);
}

/* What the owner's callbacks saw. */
struct seen {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int lost_calls, work_calls;
  int64_t last_lost;
};

static void on_lost(void *arg, struct task *t, const char *why)
{
  (void)why;
  struct seen *s = arg;
  if (atomic_exchange(&t->lost, 1))
    return;   /* the owner's side of "once" */
  pthread_mutex_lock(&s->mu);
  s->lost_calls++;
  s->last_lost = t->id;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void on_work(void *arg)
{
  struct seen *s = arg;
  pthread_mutex_lock(&s->mu);
  s->work_calls++;
  pthread_mutex_unlock(&s->mu);
}

static void lease_past_its_deadline_is_reported_lost_without_a_database(void)
{
  struct seen s = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
  struct lease_registry *r = lease_registry_new();
  struct metrics_counters c;
  metrics_counters_init(&c);
  struct db_table table = { 0 };
  double now = task_now();
  struct task *expired = new_task(7, 1, now - 1), *alive = new_task(8, 1, now + 3600);
  lease_registry_add(r, expired);
  lease_registry_add(r, alive);
  /* A socket folder that does not exist: every connection fails at once, and the thread
     keeps beating (locally) while it waits to reconnect. */
  struct lease *l = lease_start(&(struct lease_config){
    .conninfo = "host=/nonexistent/leash-test port=1", .table = &table,
    .worker_id = "test", .visibility = 60, .heartbeat = 0.05, .registry = r,
    .counters = &c, .on_lost = on_lost, .on_work = on_work, .arg = &s,
  });
  CHECK(l != NULL);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&s.mu);
  while (s.lost_calls == 0 && pthread_cond_timedwait(&s.cv, &s.mu, &until) == 0)
    ;
  pthread_mutex_unlock(&s.mu);
  /* A few more beats: the loss is not reported again, the live lease not at all. */
  struct timespec pause = { 0, 200 * 1000 * 1000 };
  nanosleep(&pause, NULL);
  lease_stop(l);
  CHECK_INT_EQ(s.lost_calls, 1);
  CHECK_INT_EQ(s.last_lost, 7);
  CHECK_INT_EQ(atomic_load(&alive->lost), 0);
  CHECK_INT_EQ(s.work_calls, 0);   /* never connected: no NOTIFY, no reap */
  CHECK_INT_EQ(atomic_load(&c.db_up), 0);
  free(expired), free(alive);
  lease_registry_free(r);
}

static const struct check_case cases[] = {
  { "registry_counts_adds_and_removes_in_any_order",
    registry_counts_adds_and_removes_in_any_order },
  { "give_up_marks_all_lost_but_the_kept_and_the_already_lost",
    give_up_marks_all_lost_but_the_kept_and_the_already_lost },
  { "lease_past_its_deadline_is_reported_lost_without_a_database",
    lease_past_its_deadline_is_reported_lost_without_a_database },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
