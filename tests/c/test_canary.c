/*
 * test_canary: the task-id choice of src/canary.c (canary_picks), which every process makes
 * on its own and must make alike: deterministic, at its share, nested (a task a 10% share
 * picks is picked by 20%), and another canary picks other tasks. The fleet-wide behaviour
 * is tests/integration/canary.sh.
 */
#include <stdint.h>
#include <stdio.h>

#include "canary.h"
#include "check.h"

#define IDS 100000

static void the_choice_is_the_same_every_time_and_at_its_share(void)
{
  for (int share = 1; share <= 100; share += 11) {
    long picked = 0;
    for (int64_t id = 1; id <= IDS; id++) {
      int p = canary_picks(id, 7, share);
      CHECK_INT_EQ(p, canary_picks(id, 7, share));   /* a retry, another pod */
      picked += p;
    }
    /* Sequential ids, hashed: within 1 point of the share (binomial sd < 0.16 points). */
    double pct = 100.0 * (double)picked / IDS;
    if (pct < share - 1.0 || pct > share + 1.0) {
      fprintf(stderr, "share %d picked %.2f%%\n", share, pct);
      CHECK(0);
    }
  }
  for (int64_t id = 1; id <= 1000; id++) {
    CHECK_INT_EQ(canary_picks(id, 3, 100), 1);
    CHECK_INT_EQ(canary_picks(id, 3, 0), 0);
  }
}

static void a_larger_share_keeps_the_tasks_of_a_smaller_one_and_another_canary_picks_others(void)
{
  long both = 0, first = 0;
  for (int64_t id = 1; id <= IDS; id++) {
    if (canary_picks(id, 1, 10))
      CHECK_INT_EQ(canary_picks(id, 1, 20), 1);
    first += canary_picks(id, 1, 10);
    both += canary_picks(id, 1, 10) && canary_picks(id, 2, 10);
  }
  /* Independent choices overlap on about 10% of 10%: far from all of them. */
  CHECK(both < first / 4);
  CHECK(both > 0);
}

static const struct check_case cases[] = {
  { "the_choice_is_the_same_every_time_and_at_its_share",
    the_choice_is_the_same_every_time_and_at_its_share },
  { "a_larger_share_keeps_the_tasks_of_a_smaller_one_and_another_canary_picks_others",
    a_larger_share_keeps_the_tasks_of_a_smaller_one_and_another_canary_picks_others },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
