/* stmtcache: prepared statements kept per pooled connection. See stmtcache.h. */
#include "stmtcache.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Longer texts are run unnamed: the cache's memory stays bounded (here and on the server). */
#define SQL_MAX 16384

/* A statement's name on the server: "leash_" and 32 hex digits of the SHA-256 of its
   parameter count (4 bytes, big-endian) and text. Named by content, not by a counter, so
   that a name means one text on every connection: behind a pooler that shares server
   sessions between clients (PgBouncer's transaction mode), a name prepared by another
   client is the same statement or none. */
#define NAME_LEN (6 + 32)

struct entry {
  char *sql;            /* NULL: a free place */
  size_t len;
  uint64_t hash;
  int nparams;
  char name[NAME_LEN + 1];
  unsigned long used;   /* the cache's tick at its last use */
  int stale;            /* to be prepared again before its next run (see why_failed) */
};

struct stmtcache {
  struct entry e[STMTCACHE_MAX];
  unsigned long tick;
};

/* What a cached statement's failed run means for it (why_failed). */
enum { RAN, REFUSED, STALE };

static int keepable(const char *sql);
static uint64_t fnv1a(const char *s, size_t n);
static int name_of(const char *sql, size_t len, int nparams, char name[NAME_LEN + 1]);
static struct entry *find(struct stmtcache *sc, const char *sql, size_t len, uint64_t h,
                          int nparams);
static struct entry *place_for(struct stmtcache *sc);
static int why_failed(const PGresult *r);
static PGresult *prepare_and_run(struct stmtcache *sc, struct entry *e, const char *drop,
                                 int again, PGconn *c, const char *sql, size_t len, uint64_t h,
                                 int nparams, const char *const *params);

struct stmtcache *stmtcache_new(void)
{
  return calloc(1, sizeof(struct stmtcache));
}

void stmtcache_free(struct stmtcache *sc)
{
  if (!sc)
    return;
  for (int i = 0; i < STMTCACHE_MAX; i++)
    free(sc->e[i].sql);
  free(sc);
}

PGresult *stmtcache_exec(struct stmtcache *sc, PGconn *c, const char *sql, int nparams,
                         const char *const *params)
{
  size_t len = sql ? strlen(sql) : 0;
  if (!sc || len == 0 || len > SQL_MAX || !keepable(sql) ||
      PQpipelineStatus(c) != PQ_PIPELINE_OFF)
    return PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
  uint64_t h = fnv1a(sql, len);
  struct entry *e = find(sc, sql, len, h, nparams);
  char drop[NAME_LEN + 1] = "";
  if (e && !e->stale) {
    e->used = ++sc->tick;
    PGresult *r = PQexecPrepared(c, e->name, nparams, params, NULL, NULL, 0);
    int why = why_failed(r);
    if (why == RAN)
      return r;
    if (why == STALE) {   /* the error is the script's; the next run prepares it again */
      e->stale = 1;
      return r;
    }
    /* Refused before it ran: prepared again in the same place, and run once more. The old
       statement is deallocated whether or not the server still has it (its own sync). */
    PQclear(r);
  } else if (!e) {
    e = place_for(sc);
  }
  if (e->sql)
    memcpy(drop, e->name, sizeof drop);
  return prepare_and_run(sc, e, *drop ? drop : NULL, 0, c, sql, len, h, nparams, params);
}

/* Fills e with sql, prepared under its name, and runs it: one round trip, in which the
   statement named drop (e's last, or one in the way), when not NULL, is deallocated first
   (its own sync, so that its failure, say a script deallocated it already, does not abort
   the rest). again: this is the second try of one call. */
static PGresult *prepare_and_run(struct stmtcache *sc, struct entry *e, const char *drop,
                                 int again, PGconn *c, const char *sql, size_t len, uint64_t h,
                                 int nparams, const char *const *params)
{
  char old[NAME_LEN + 16], name[NAME_LEN + 1];
  int drop_old = drop != NULL;
  if (name_of(sql, len, nparams, name) != 0 || PQenterPipelineMode(c) != 1)
    return PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);   /* e stays as it was */
  snprintf(old, sizeof old, "DEALLOCATE %s", drop_old ? drop : "");
  free(e->sql);
  *e = (struct entry){ 0 };
  int want = 1, sent = 1;
  if (drop_old) {
    sent = sent && PQsendQueryParams(c, old, 0, NULL, NULL, NULL, NULL, 0) == 1 &&
           PQpipelineSync(c) == 1;
    want++;
  }
  sent = sent && PQsendPrepare(c, name, sql, nparams, NULL) == 1 &&
         PQsendQueryPrepared(c, name, nparams, params, NULL, NULL, 0) == 1 &&
         PQpipelineSync(c) == 1;
  /* The results in order: [DEALLOCATE, sync,] Parse, Bind/Execute, sync. One NULL ends each
     statement's results; two in a row mean the connection failed. */
  PGresult *got[3] = { NULL, NULL, NULL };
  int n = 0, syncs = 0, nulls = 0;
  while (sent && syncs < want && nulls < 2) {
    PGresult *r = PQgetResult(c);
    if (!r) {
      nulls++;
      continue;
    }
    nulls = 0;
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      syncs++;
      PQclear(r);
    } else if (n < 3) {
      got[n++] = r;
    } else {
      PQclear(r);
    }
  }
  int whole = sent && syncs == want && n == (drop_old ? 3 : 2);
  /* Left in pipeline mode only with results pending, on a failed connection: the pool closes
     a connection that is not idle. */
  PQexitPipelineMode(c);
  PGresult *prep = whole ? got[drop_old ? 1 : 0] : NULL;
  PGresult *run = whole ? got[drop_old ? 2 : 1] : NULL;
  if (drop_old)
    PQclear(got[0]);
  if (!whole) {
    /* The connection failed: the server's last word, if it said one (a FATAL on its way
       out), else NULL, and the caller reads PQerrorMessage, as after PQexecParams. */
    PGresult *last = NULL;
    for (int i = drop_old; i < n; i++) {
      if (PQresultStatus(got[i]) == PGRES_FATAL_ERROR) {
        PQclear(last);
        last = got[i];
      } else {
        PQclear(got[i]);
      }
    }
    return last;
  }
  if (PQresultStatus(prep) == PGRES_COMMAND_OK) {
    PQclear(prep);
    e->sql = malloc(len + 1);
    if (e->sql) {
      memcpy(e->sql, sql, len + 1);
      e->len = len;
      e->hash = h;
      e->nparams = nparams;
      memcpy(e->name, name, sizeof name);
      e->used = ++sc->tick;
    }
    /* Out of memory: the statement stays on the server, where the next miss of this text
       finds its name taken and deallocates it (below). */
    return run;
  }
  PQclear(run);   /* PGRES_PIPELINE_ABORTED: it never ran */
  const char *state = PQresultErrorField(prep, PG_DIAG_SQLSTATE);
  if (state && strcmp(state, "42P05") == 0) {
    /* The name is taken: this text's statement left on the server (out of memory above,
       a DEALLOCATE cancelled by statement_timeout), a script's own PREPARE under it, or
       another text of the same name (128 bits of SHA-256 alike) in this cache. Once, it
       is deallocated and this one prepared in its place; else this one runs unnamed. */
    PQclear(prep);
    if (!again)
      return prepare_and_run(sc, e, name, 1, c, sql, len, h, nparams, params);
    return PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
  }
  return prep;   /* the statement's own error (syntax, a missing table): what it gets unnamed */
}

/* A plannable statement's first word, after blanks and opening parentheses. */
static int keepable(const char *sql)
{
  static const char *const words[] = { "select", "insert", "update", "delete",
                                       "with",   "values", "table",  "merge" };
  const char *p = sql;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '(')
    p++;
  size_t n = 0;
  while ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z'))
    n++;
  char next = p[n];
  if ((next >= '0' && next <= '9') || next == '_' || next == '$' || (unsigned char)next >= 0x80)
    return 0;
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strlen(words[i]) == n && strncasecmp(p, words[i], n) == 0)
      return 1;
  return 0;
}

/* 0, or -1 when OpenSSL cannot (out of memory). */
static int name_of(const char *sql, size_t len, int nparams, char name[NAME_LEN + 1])
{
  unsigned char md[EVP_MAX_MD_SIZE], count[4] = {
    (unsigned char)((unsigned)nparams >> 24), (unsigned char)((unsigned)nparams >> 16),
    (unsigned char)((unsigned)nparams >> 8), (unsigned char)nparams };
  unsigned mdlen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(ctx, count, sizeof count) == 1 &&
           EVP_DigestUpdate(ctx, sql, len) == 1 && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 &&
           mdlen >= 16;
  EVP_MD_CTX_free(ctx);
  if (!ok)
    return -1;
  memcpy(name, "leash_", 6);
  for (int i = 0; i < 16; i++)
    snprintf(name + 6 + 2 * i, 3, "%02x", md[i]);
  return 0;
}

static uint64_t fnv1a(const char *s, size_t n)
{
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ULL;
  }
  return h;
}

static struct entry *find(struct stmtcache *sc, const char *sql, size_t len, uint64_t h,
                          int nparams)
{
  for (int i = 0; i < STMTCACHE_MAX; i++) {
    struct entry *e = &sc->e[i];
    if (e->sql && e->hash == h && e->len == len && e->nparams == nparams &&
        memcmp(e->sql, sql, len) == 0)
      return e;
  }
  return NULL;
}

/* A free place, else the least recently used one. */
static struct entry *place_for(struct stmtcache *sc)
{
  struct entry *lru = &sc->e[0];
  for (int i = 0; i < STMTCACHE_MAX; i++) {
    if (!sc->e[i].sql)
      return &sc->e[i];
    if (sc->e[i].used < lru->used)
      lru = &sc->e[i];
  }
  return lru;
}

/* The refusals of a cached statement that come before it runs, when the server analyses it
   again at Bind: its statement gone (a script's DEALLOCATE or DISCARD ALL: 26000 from
   FetchPreparedStatement), its result columns changed under it (0A000 from
   RevalidateCachedQuery), or the new analysis failing with the parameter types fixed when it
   was prepared (another search_path, a column's type altered), which a new Parse infers
   afresh: an operator, a function or an assignment that no longer fits them (op_error,
   ParseFuncOrColumn, transformAssignedExpr) or a column gone (errorMissingColumn). Told by
   the function that raised them (its name is never translated; the message may be), each
   one of the parser's analysis, never called while a statement runs.

   Without an error context the refusal is REFUSED: nothing ran, and the statement is
   prepared again and run once more. With one it is STALE: the context may be a function
   the statement was running (its EXECUTE of a missing statement, after a nextval), so it
   is not run again, but the next call prepares it again (a context can also be Bind's own
   parameter listing, log_parameter_max_length_on_error). */
static int why_failed(const PGresult *r)
{
  static const char *const at_bind[][2] = {
    { "26000", "FetchPreparedStatement" }, { "0A000", "RevalidateCachedQuery" },
    { "42883", "op_error" },               { "42883", "ParseFuncOrColumn" },
    { "42804", "transformAssignedExpr" },  { "42703", "errorMissingColumn" },
  };
  if (!r || PQresultStatus(r) != PGRES_FATAL_ERROR)
    return RAN;
  const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  const char *fn = PQresultErrorField(r, PG_DIAG_SOURCE_FUNCTION);
  if (!state || !fn)
    return RAN;
  for (size_t i = 0; i < sizeof at_bind / sizeof at_bind[0]; i++)
    if (strcmp(state, at_bind[i][0]) == 0 && strcmp(fn, at_bind[i][1]) == 0)
      return PQresultErrorField(r, PG_DIAG_CONTEXT) ? STALE : REFUSED;
  return RAN;
}
