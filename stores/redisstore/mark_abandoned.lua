-- Marks an acquisition abandoned: its caller left while the acquire was in
-- flight, and the Store undoes it. Every acquire script refuses a token whose
-- mark exists (see refuse_abandoned), so a late copy of the acquire, held up
-- in the network past the undo, grants nothing.
-- KEYS[1] the mark (in the slot of the acquisition's first key)
-- ARGV[1] how long to keep it, ms
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return 1
