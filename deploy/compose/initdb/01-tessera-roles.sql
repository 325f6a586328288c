-- One login role and one schema per Tessera service: the same end state as
-- shared.db.provision_service (role tessera_<service> owns schema <service>, may
-- connect to the database, and can create nothing anywhere else).
--
-- The postgres image runs this file once, when its data volume is initialised
-- (/docker-entrypoint-initdb.d), with psql. psql reads each role's password from
-- the container's environment (\getenv, PostgreSQL 15+), so no password is
-- written here; an unset variable leaves :'pw' unexpanded and the script stops.
-- The Kubernetes manifest (deploy/k8s/postgres.yaml) carries an identical copy;
-- tests/contract/test_deploy.py keeps the two equal.
\set ON_ERROR_STOP on
\getenv db POSTGRES_DB

REVOKE CREATE ON SCHEMA public FROM PUBLIC;

\getenv pw TESSERA_DB_PASSWORD_GATEWAY
CREATE ROLE tessera_gateway WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS gateway AUTHORIZATION tessera_gateway;
REVOKE ALL ON SCHEMA gateway FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_gateway;
ALTER ROLE tessera_gateway SET search_path = gateway;

\getenv pw TESSERA_DB_PASSWORD_ALLOCATION
CREATE ROLE tessera_allocation WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS allocation AUTHORIZATION tessera_allocation;
REVOKE ALL ON SCHEMA allocation FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_allocation;
ALTER ROLE tessera_allocation SET search_path = allocation;

\getenv pw TESSERA_DB_PASSWORD_SAGA
CREATE ROLE tessera_saga WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS saga AUTHORIZATION tessera_saga;
REVOKE ALL ON SCHEMA saga FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_saga;
ALTER ROLE tessera_saga SET search_path = saga;

\getenv pw TESSERA_DB_PASSWORD_SCHEDULER
CREATE ROLE tessera_scheduler WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS scheduler AUTHORIZATION tessera_scheduler;
REVOKE ALL ON SCHEMA scheduler FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_scheduler;
ALTER ROLE tessera_scheduler SET search_path = scheduler;

\getenv pw TESSERA_DB_PASSWORD_NETWORK
CREATE ROLE tessera_network WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS network AUTHORIZATION tessera_network;
REVOKE ALL ON SCHEMA network FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_network;
ALTER ROLE tessera_network SET search_path = network;

\getenv pw TESSERA_DB_PASSWORD_STORAGE
CREATE ROLE tessera_storage WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS storage AUTHORIZATION tessera_storage;
REVOKE ALL ON SCHEMA storage FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_storage;
ALTER ROLE tessera_storage SET search_path = storage;

\getenv pw TESSERA_DB_PASSWORD_BILLING
CREATE ROLE tessera_billing WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS billing AUTHORIZATION tessera_billing;
REVOKE ALL ON SCHEMA billing FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_billing;
ALTER ROLE tessera_billing SET search_path = billing;

\getenv pw TESSERA_DB_PASSWORD_PAAS
CREATE ROLE tessera_paas WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS paas AUTHORIZATION tessera_paas;
REVOKE ALL ON SCHEMA paas FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_paas;
ALTER ROLE tessera_paas SET search_path = paas;

\getenv pw TESSERA_DB_PASSWORD_NODE_AGENT
CREATE ROLE tessera_node_agent WITH LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE SCHEMA IF NOT EXISTS node_agent AUTHORIZATION tessera_node_agent;
REVOKE ALL ON SCHEMA node_agent FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO tessera_node_agent;
ALTER ROLE tessera_node_agent SET search_path = node_agent;

\unset pw
