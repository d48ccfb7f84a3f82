-- A waiting task made pending again by hand looks at its wait again (issue #14's soak, seed 1
-- on 029: one task of 20,000 left waiting at the end).
--
-- The soak's driver sets a random pending head dead by hand and a moment later pending
-- again, as an operator would. A task waiting without a time (run_after 'infinity': on an
-- event, or on other tasks) can be such a head. Its event was signalled while it was dead:
-- the signal's UPDATE wakes pending waiters only (019), so it passed the dead row over, and
-- the row came back pending still waiting, for a signal already given: it would have waited
-- for its deadline (a day). The same holds for a wait on tasks whose last one settled while
-- the waiter was dead (the settle's wake looks for pending waiters too).
--
-- Now a row that a change by hand makes pending, waiting without a time, goes through the
-- wakes that a settle's waiters go through, in the same transaction: wait_events for a wait
-- on an event (it takes the event's lock, so a signal either committed before its look or
-- waits for this commit and then finds the row pending: 019's protocol), wait_wake for a wait
-- on tasks (the awaited tasks' locks, the same way). A wait whose condition does not hold yet
-- keeps waiting. Changes made by the queue's own functions (leash.internal) are not changes by
-- hand and are not looked at here.

CREATE FUNCTION {{obj:waits_by_hand}}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.wait_event IS NOT NULL THEN
    PERFORM {{obj:wait_events}}(ARRAY[NEW.id]);
  ELSIF NEW.wait_ids IS NOT NULL THEN
    PERFORM {{obj:wait_wake}}(ARRAY[NEW.id]);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER {{name:waits_by_hand}} AFTER UPDATE OF status ON {{table}}
  FOR EACH ROW
  WHEN (NEW.status = 'pending' AND OLD.status <> 'pending' AND NEW.run_after = 'infinity'
        AND (NEW.wait_event IS NOT NULL OR NEW.wait_ids IS NOT NULL)
        AND current_setting('leash.internal', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {{obj:waits_by_hand}}();
