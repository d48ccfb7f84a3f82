-- The seed table (SPEC.md), created only when it does not exist yet: a table someone made
-- with the seed DDL is adopted as it is, rows and ids untouched.
-- Placeholders (filled by migrate.c, every name quoted with PQescapeIdentifier):
--   {{table}} the queue table, {{table_literal}} its name as a string literal,
--   {{obj:X}} the object "<table>_X" in the table's schema, {{name:X}} the same unqualified.
CREATE TABLE IF NOT EXISTS {{table}} (
  id            bigserial PRIMARY KEY,
  tenant_id     text NOT NULL,
  shard_key     text NOT NULL,
  payload       jsonb NOT NULL,
  status        text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending','leased','done','dead')),
  run_after     timestamptz NOT NULL DEFAULT now(),
  locked_until  timestamptz,
  lease_owner   text,
  attempts      int NOT NULL DEFAULT 0,
  max_attempts  int NOT NULL DEFAULT 8,
  last_error    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The claim path's index: only pending rows, so done/dead rows never enter a claim's scan.
CREATE INDEX IF NOT EXISTS {{name:claim_idx}}
  ON {{table}} (run_after, id) WHERE status = 'pending';
