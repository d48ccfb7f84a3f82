/*
 * test_lifecycle: the C side of the lifecycle table (src/lifecycle.c) for snoozes and the
 * backoff. tests/integration/lifecycle.sh checks the same numbers against the SQL
 * (<table>_backoff, the settle's defaults) and leash.testing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lifecycle.h"

#define CHECK_NEAR(a, b) CHECK(fabs((a) - (b)) < 1e-9)

/* least(cap, base ^ attempts) x (1 - jitter x u): the policy at its edges. */
static void backoff_is_base_to_the_attempts_capped_then_jittered(void)
{
  CHECK_NEAR(lifecycle_backoff(2, 3600, 5, 0, 0), 32);
  CHECK_NEAR(lifecycle_backoff(2, 3600, 11, 0, 0), 2048);
  CHECK_NEAR(lifecycle_backoff(2, 3600, 12, 0, 0), 3600);
  CHECK_NEAR(lifecycle_backoff(2, 3600, 1000, 0, 0), 3600);   /* no overflow past the cap */
  CHECK_NEAR(lifecycle_backoff(1000, 86400, 1000, 0, 0), 86400);
  CHECK_NEAR(lifecycle_backoff(1, 3600, 7, 0, 0), 1);
  CHECK_NEAR(lifecycle_backoff(3, 0, 4, 0.5, 0.3), 0);
  CHECK_NEAR(lifecycle_backoff(2, 3600, 5, 0.5, 0), 32);       /* equal jitter: [d/2, d] */
  CHECK_NEAR(lifecycle_backoff(2, 3600, 5, 0.5, 1), 16);
  CHECK_NEAR(lifecycle_backoff(2, 3600, 5, 1, 1), 0);          /* full jitter: [0, d] */
  CHECK_NEAR(lifecycle_backoff(10, 60, 1, 0.5, 0.5), 7.5);
  CHECK(LIFECYCLE_BACKOFF_JITTER >= 0 && LIFECYCLE_BACKOFF_JITTER <= 1);
  CHECK(LIFECYCLE_BACKOFF_CAP_S <= LIFECYCLE_MAX_BACKOFF_CAP_S);
}

/* Every line "base cap attempts jitter u backoff" of the file $LEASH_BACKOFF_GRID (written
   by tests/integration/lifecycle.sh from the SQL's <table>_backoff) against
   lifecycle_backoff, within a microsecond: C and SQL compute the same policy. Without the
   variable (the unit run), a few lines the SQL gives are checked. */
static void backoff_agrees_with_the_grid_the_sql_wrote(void)
{
  static const char builtin[] = "2 3600 5 0 0 32\n1000 86400 1000 1 0.999 86.4\n"
                                "1.5 60 20 0.5 0.25 52.5\n1 0.5 7 0.5 0 0.5\n";
  const char *path = getenv("LEASH_BACKOFF_GRID");
  FILE *f = path ? fopen(path, "r") : fmemopen((void *)builtin, sizeof builtin - 1, "r");
  CHECK(f != NULL);
  double b, c, j, u, want;
  int n, lines = 0, bad = 0;
  while (fscanf(f, "%lf %lf %d %lf %lf %lf", &b, &c, &n, &j, &u, &want) == 6) {
    double got = lifecycle_backoff(b, c, n, j, u);
    if (fabs(got - want) > 1e-6) {
      if (bad++ < 5)
        fprintf(stderr, "backoff(%g, %g, %d, %g, %g): C %.6f, SQL %.6f\n", b, c, n, j, u, got,
                want);
    }
    lines++;
  }
  fclose(f);
  CHECK(lines >= 4);
  CHECK_INT_EQ(bad, 0);
  if (path)
    printf("%d lines agree\n", lines);
}

/* The words the settle (sql/019_waits.sql) reads and the reaper writes for a wait, and
   leash.wait's bounds as the kit states them (scripts/lib/leash/testing.lua). */
static void wait_has_its_kind_and_causes(void)
{
  CHECK_STR_EQ(lifecycle_kind_sql(OUTCOME_WAIT), "wait");
  CHECK_STR_EQ(lifecycle_cause_name(CAUSE_WAITING), "waiting");
  CHECK_STR_EQ(lifecycle_cause_name(CAUSE_WAIT_DEADLINE), "wait_deadline");
  CHECK_INT_EQ(lifecycle_cause_is_crash(CAUSE_WAITING), 0);
  CHECK_INT_EQ(lifecycle_cause_is_crash(CAUSE_WAIT_DEADLINE), 0);
  CHECK(LIFECYCLE_WAIT_DEADLINE_S > 0 && LIFECYCLE_WAIT_DEADLINE_S <= LIFECYCLE_MAX_WAIT_S);
  /* 019's SQL cuts deadlines and clock waits at 604800 s as well. */
  CHECK(LIFECYCLE_MAX_WAIT_S == 604800.0);
}

/* The words the settle reads and writes for a snooze. */
static void snooze_has_its_kind_and_causes(void)
{
  CHECK_STR_EQ(lifecycle_kind_sql(OUTCOME_SNOOZE), "snooze");
  CHECK_STR_EQ(lifecycle_cause_name(CAUSE_SNOOZED), "snoozed");
  CHECK_STR_EQ(lifecycle_cause_name(CAUSE_SNOOZE_LIMIT), "snooze_limit");
  CHECK_INT_EQ(lifecycle_cause_is_crash(CAUSE_SNOOZED), 0);
  CHECK_INT_EQ(lifecycle_cause_is_crash(CAUSE_SNOOZE_LIMIT), 0);
  for (int k = 0; k < OUTCOME_KINDS; k++)
    CHECK(lifecycle_kind_sql((enum outcome_kind)k) != NULL);
  for (int c = 0; c < CAUSE_COUNT; c++)
    CHECK(strcmp(lifecycle_cause_name((enum outcome_cause)c), "none") != 0 || c == CAUSE_NONE);
}

static const struct check_case cases[] = {
  { "backoff_is_base_to_the_attempts_capped_then_jittered",
    backoff_is_base_to_the_attempts_capped_then_jittered },
  { "snooze_has_its_kind_and_causes", snooze_has_its_kind_and_causes },
  { "wait_has_its_kind_and_causes", wait_has_its_kind_and_causes },
  { "backoff_agrees_with_the_grid_the_sql_wrote", backoff_agrees_with_the_grid_the_sql_wrote },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
