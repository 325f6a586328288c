-- The provision command an instance was made from, so a reconcile can make it again when its VM vanished.
ALTER TABLE instances ADD COLUMN command jsonb;
