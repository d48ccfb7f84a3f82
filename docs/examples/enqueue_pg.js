// Enqueue leash tasks from a Node application with pg (docs/enqueue-from-apps.md).
//
// The task is written in the application's own transaction: it exists exactly when the
// order does. Run: node enqueue_pg.js [postgresql://user@host/db]  (after `leash migrate`;
// npm install pg). tests/integration/sqlapi.sh runs this file and checks the rows it leaves.
'use strict';
const { Client } = require('pg');

const QUEUE = 'agent_work_queue'; // the table `leash migrate` made (--table)

// One order and its task, committed together, or neither.
async function placeOrder(db, orderId, fail = false) {
  await db.query('BEGIN');
  try {
    await db.query('INSERT INTO orders (id) VALUES ($1)', [orderId]);
    // Named arguments: every option `leash enqueue` has (tenant, shard, run_after, delay_s,
    // max_attempts, batch, priority, dedup_key, max_crashes).
    const r = await db.query(
      `SELECT ${QUEUE}_enqueue($1::jsonb, batch => $2, dedup_key => $3) AS id`,
      [JSON.stringify({ order_id: orderId }), 'orders', `order-${orderId}`]);
    if (fail) throw new Error('payment refused'); // rolls back the order and its task
    await db.query('COMMIT');
    return r.rows[0].id; // a bigint arrives as a string
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

async function main() {
  // A URI, or without one the PG* environment variables (PGHOST, PGDATABASE, ...).
  const db = new Client(process.argv[2] ? { connectionString: process.argv[2] } : {});
  await db.connect();
  await db.query('CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY)');

  const first = await placeOrder(db, 1);
  await placeOrder(db, 2, true).catch(() => {});

  // A retried request (same dedup key while the task is pending or leased) gets the same
  // task back instead of a second one.
  const again = (await db.query(`SELECT ${QUEUE}_enqueue($1::jsonb, dedup_key => $2) AS id`,
    [JSON.stringify({ order_id: 1 }), 'order-1'])).rows[0].id;

  // Many at once: a JSON array of objects with the fields of a `leash enqueue --file` line.
  const tasks = [0, 1, 2].map((n) => ({ payload: { n }, batch: 'bulk', priority: n }));
  const bulk = (await db.query(`SELECT ordinal, id, inserted FROM ${QUEUE}_enqueue_many($1::jsonb)`,
    [JSON.stringify(tasks)])).rows;

  const rolledBack = (await db.query('SELECT count(*)::int AS n FROM orders WHERE id = 2')).rows[0].n;
  await db.end();
  console.log(`result: committed=1 rolled_back=${rolledBack} ` +
    `dedup_same_id=${again === first} bulk=${bulk.filter((b) => b.inserted).length}`);
}

main().catch((e) => { console.error(`enqueue_pg.js: ${e.message}`); process.exit(1); });
