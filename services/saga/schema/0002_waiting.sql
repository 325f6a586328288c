-- A step whose participant replied "queued" (scheduler: nothing fits yet) waits with a longer deadline.
ALTER TABLE saga_steps DROP CONSTRAINT saga_steps_status_check;
ALTER TABLE saga_steps ADD CONSTRAINT saga_steps_status_check CHECK (status IN ('invoked', 'waiting', 'succeeded',
    'failed', 'timed_out', 'retrying', 'armed', 'disarmed', 'compensating', 'compensated'));
