/*
 * test_queue: the lease-key lookups that match a heartbeat's and a settle's answers to the
 * tasks a process holds (queue_keys_sort, queue_keys_find): by (id, attempt), or by id alone;
 * and the one buffer and text[] builder its statements' parameters are made with (buf.h).
 */
#include <stdlib.h>
#include <string.h>

#include "buf.h"

#include "check.h"
#include "queue.h"

/* Quotes and backslashes are escaped, commas, braces, spaces and NULL-looking words are
   quoted as they are, and an empty list is {}. */
static void text_arrays_quote_every_element(void)
{
  static const char *const v[] = { "plain", "a,b", "{x}", "q\"uote", "back\\slash", "NULL", "",
                                   " sp " };
  char *s = text_array_literal(v, sizeof v / sizeof v[0]);
  CHECK(s != NULL);
  CHECK_STR_EQ(s, "{\"plain\",\"a,b\",\"{x}\",\"q\\\"uote\",\"back\\\\slash\",\"NULL\",\"\","
                  "\" sp \"}");
  free(s);
  s = text_array_literal(NULL, 0);
  CHECK_STR_EQ(s, "{}");
  free(s);
}

/* A buffer grows past its first block and past printf's small path, stays terminated, and
   gives "" when nothing was added. */
static void buffers_grow_and_stay_terminated(void)
{
  struct buf b = { 0 };
  char *s = buf_take(&b);
  CHECK_STR_EQ(s, "");
  free(s);
  char big[1000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  for (int i = 0; i < 100; i++)
    CHECK_INT_EQ(buf_printf(&b, "%d:%s;", i, i % 10 ? "y" : big), 0);
  CHECK(b.len == strlen(b.s));
  CHECK(strncmp(b.s, "0:xxx", 5) == 0);
  CHECK(strstr(b.s, ";99:y;") != NULL);
  CHECK(!b.oom);
  buf_free(&b);
  CHECK(b.s == NULL && b.len == 0);
}

static void keys_are_found_by_id_and_token(void)
{
  enum { N = 1000 };
  struct lease_key *k = malloc(N * sizeof *k);
  CHECK(k != NULL);
  /* Ids in a scrambled order, each twice (tokens 1 and 2) but 7 only once. */
  int n = 0;
  for (int i = 0; i < N / 2; i++) {
    int64_t id = (int64_t)((i * 7919) % (N / 2)) + 1;
    k[n++] = (struct lease_key){ .id = id, .token = 2 };
    if (id != 7)
      k[n++] = (struct lease_key){ .id = id, .token = 1 };
  }
  queue_keys_sort(k, n);
  for (int i = 1; i < n; i++)
    CHECK(k[i - 1].id < k[i].id || (k[i - 1].id == k[i].id && k[i - 1].token < k[i].token));
  int j = queue_keys_find(k, n, 42, 2);
  CHECK(j >= 0);
  CHECK_INT_EQ(k[j].id, 42);
  CHECK_INT_EQ(k[j].token, 2);
  j = queue_keys_find(k, n, 42, -1);   /* by id: the first of its keys */
  CHECK(j >= 0);
  CHECK_INT_EQ(k[j].token, 1);
  CHECK_INT_EQ(queue_keys_find(k, n, 7, 1), -1);
  CHECK(queue_keys_find(k, n, 7, 2) >= 0);
  CHECK_INT_EQ(queue_keys_find(k, n, 0, -1), -1);
  CHECK_INT_EQ(queue_keys_find(k, n, N, -1), -1);
  CHECK_INT_EQ(queue_keys_find(k, n, 42, 3), -1);
  free(k);
}

static void empty_and_single_key_sets(void)
{
  struct lease_key one = { .id = 5, .token = 1 };
  CHECK_INT_EQ(queue_keys_find(NULL, 0, 5, 1), -1);
  queue_keys_sort(&one, 1);
  CHECK_INT_EQ(queue_keys_find(&one, 1, 5, 1), 0);
  CHECK_INT_EQ(queue_keys_find(&one, 1, 5, -1), 0);
  CHECK_INT_EQ(queue_keys_find(&one, 1, 4, -1), -1);
  CHECK_INT_EQ(queue_keys_find(&one, 1, 6, 1), -1);
}

/* The fallbacks (sql/010) set a row aside only for errors that are the row's; anything else
   (the connection, a cancel, serialization, permissions, read-only) must propagate, or a
   passing outage would empty the queue into dead. */
static void only_a_rows_errors_call_the_fallback(void)
{
  static const char *const rows[] = { "22003", "22P05", "22008", "23514", "23505", "54000",
                                      "P0001" };
  static const char *const not_rows[] = { "", "08006", "57014", "57P01", "40001", "40P01",
                                          "53200", "42501", "25006", "42883", "55P03", "XX000" };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    CHECK_INT_EQ(queue_row_error(rows[i]), 1);
  for (size_t i = 0; i < sizeof not_rows / sizeof not_rows[0]; i++)
    CHECK_INT_EQ(queue_row_error(not_rows[i]), 0);
  CHECK_INT_EQ(queue_row_error(NULL), 0);
}

static const struct check_case cases[] = {
  { "only_a_rows_errors_call_the_fallback", only_a_rows_errors_call_the_fallback },
  { "keys_are_found_by_id_and_token", keys_are_found_by_id_and_token },
  { "text_arrays_quote_every_element", text_arrays_quote_every_element },
  { "buffers_grow_and_stay_terminated", buffers_grow_and_stay_terminated },
  { "empty_and_single_key_sets", empty_and_single_key_sets },
  { NULL, NULL }
};

int main(int argc, char **argv)
{
  return check_main(cases, argc, argv);
}
