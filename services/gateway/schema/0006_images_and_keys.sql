-- The image catalog the gateway owns (like Glance's images, kept small; kernel/initrd/kernel_args for direct
-- kernel boot). An allocation snapshots its image into the allocation.request command (Guest.image), so a
-- change to or the deletion of a catalog row never touches an allocation. At most one image is the default
-- (what an allocation naming no image boots); the default is always public.
CREATE TABLE IF NOT EXISTS images (
    id           uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    os           text NOT NULL,
    format       text NOT NULL CHECK (format IN ('qcow2', 'raw')),
    source       text NOT NULL,
    sha256       text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    min_disk_gb  int  NOT NULL CHECK (min_disk_gb BETWEEN 1 AND 65536),
    visibility   text NOT NULL CHECK (visibility IN ('public', 'private')),
    tenant_id    uuid REFERENCES tenants (id),
    kernel       text,
    initrd       text,
    kernel_args  text,
    is_default   boolean NOT NULL DEFAULT false,
    created_by   uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((visibility = 'private') = (tenant_id IS NOT NULL)),
    CHECK (visibility = 'public' OR NOT is_default)
);
CREATE UNIQUE INDEX IF NOT EXISTS images_one_default ON images (is_default) WHERE is_default;
CREATE INDEX IF NOT EXISTS images_page ON images (created_at DESC, id DESC);

-- Each user's SSH public keys (like Nova's keypairs): a user sees and uses only their own.
CREATE TABLE IF NOT EXISTS ssh_keys (
    user_id      uuid NOT NULL REFERENCES users (id),
    name         text NOT NULL,
    key_type     text NOT NULL,
    public_key   text NOT NULL,
    fingerprint  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, name)
);
