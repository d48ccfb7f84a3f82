/*
 * migrations: the files of sql/, compiled into the binary by cmake/embed_sql.cmake, in
 * apply order. Their text holds placeholders that migrate.c fills with quoted names.
 */
#ifndef LEASH_MIGRATIONS_H
#define LEASH_MIGRATIONS_H

struct migration {
  int version;        /* the file's leading number */
  const char *name;   /* the file's name, recorded when applied */
  const char *sql;
};

extern const struct migration migrations[];
extern const int migrations_count;

#endif
